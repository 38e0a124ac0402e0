"""bench/ours.py: the tuned plan's note of what the tuner measured."""

from types import SimpleNamespace

from opgraph.core.config import EngineConfig


def _step(i, chosen, others):
    return SimpleNamespace(index=i, config=chosen, alternatives=tuple(others))


def test_tuning_note_names_the_choice_and_every_alternative_with_the_tuners_times():
    from bench.ours import tuning_note

    chosen = EngineConfig("triton", (("template", "attention"), ("BLOCK_M", 64)), measured_us=80.5)
    other = EngineConfig("triton", (("template", "attention"), ("BLOCK_M", 128)), measured_us=91.25)
    failed = EngineConfig("cudnn", (("plan", 0),))
    note = tuning_note(SimpleNamespace(steps=[_step(0, chosen, [other, failed])]))
    assert note == ("tuner step 0: chose triton[BLOCK_M=64] 80.5 µs; others triton[BLOCK_M=128] 91.2, cudnn[plan=0] -")


def test_tuning_note_is_empty_for_untuned_or_long_plans():
    from bench.ours import tuning_note

    untuned = EngineConfig("triton", (("BLOCK_M", 64),))
    assert tuning_note(SimpleNamespace(steps=[_step(0, untuned, [])])) == ""
    tuned = EngineConfig("triton", (("BLOCK_M", 64),), measured_us=1.0)
    assert tuning_note(SimpleNamespace(steps=[_step(i, tuned, []) for i in range(3)])) == ""


def test_steps_note_splits_a_plans_device_time_by_engine_and_names_the_slowest_steps(rng):
    """A plan of several steps (the reference engine on the CPU: each op its own step) profiled step by
    step: the engines' totals add up to the whole, and the slowest steps name their ops."""
    import re

    import opgraph as og
    from bench.ours import steps_note

    g = og.Graph("chain", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[1, 32, 32], name="x")
    y = x
    for i in range(3):  # a matmul's result feeds the next one's A: one step each
        y = g.relu(g.matmul(y, g.tensor(dim=[1, 32, 32], name=f"w{i}")))
    y.set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    assert len(plan.steps) > 2
    pack = {u: rng.standard_normal(t.dim).astype("float32") for u, t in g.final.tensors.items() if not t.is_virtual}
    note = steps_note(plan, pack)
    total = float(re.search(r"device µs: ([\d,.]+) in all", note).group(1).replace(",", ""))
    parts = [float(v.replace(",", "")) for v in re.findall(r"x\d+ ([\d,.]+)", note)]
    assert note.startswith("steps alone") and "triton:matmul x3" in note and "slowest: " in note
    assert abs(sum(parts) - total) <= 1 + 0.01 * total
    assert "matmul+relu " in note.split("slowest: ")[1]


def test_a_failing_after_note_is_a_note_not_the_rows_failure():
    from bench.runner import _after_note

    assert _after_note(lambda: "steps alone: 12") == "steps alone: 12"

    def broken():
        raise RuntimeError("profiler busy")

    assert _after_note(broken) == "(step profile failed: RuntimeError: profiler busy)"
