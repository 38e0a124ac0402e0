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
    assert note == ("tuner step 0: chose triton[BLOCK_M=64] 80.5 µs; others triton[BLOCK_M=128] 91.2, "
                    "cudnn[plan=0] -")


def test_tuning_note_is_empty_for_untuned_or_long_plans():
    from bench.ours import tuning_note

    untuned = EngineConfig("triton", (("BLOCK_M", 64),))
    assert tuning_note(SimpleNamespace(steps=[_step(0, untuned, [])])) == ""
    tuned = EngineConfig("triton", (("BLOCK_M", 64),), measured_us=1.0)
    assert tuning_note(SimpleNamespace(steps=[_step(i, tuned, []) for i in range(3)])) == ""
