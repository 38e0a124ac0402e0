"""Build options that filter engine configs by notes, engine and workspace (cuDNN's deselect_*)."""

from __future__ import annotations

import json

import pytest

import opgraph as og
from opgraph import DataType as DT
from opgraph.build import autotune
from opgraph.core.config import BehaviorNote, EngineConfig, NumericalNote
from opgraph.build.filters import ConfigFilter

from ..engines.test_triton_conv import conv_graph
from ..helpers import assert_engine_matches


def _relu_graph():
    g = og.Graph("f", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 64], name="x")
    b = g.tensor(dim=[1, 64], name="b")
    g.relu(g.add(x, b)).set_output(True).set_name("y")
    return g


def _conv_bias_relu():
    g, _, _, y = conv_graph((2, 8, 6, 6), (16, 8, 3, 3), padding=[1, 1])
    b = g.tensor(dim=[1, 16, 1, 1], name="b")
    g.relu(g.bias(y, b)).set_output(True)
    return g


# -- the filter itself (tier 1) --------------------------------------------------------------------------


def test_select_needs_every_note_deselect_drops_any():
    cfg = EngineConfig(
        "triton",
        (("BLOCK", 64),),
        frozenset({NumericalNote.TENSOR_CORE}),
        frozenset({BehaviorNote.RUNTIME_COMPILATION, BehaviorNote.DEVICE_SCALARS}),
    )
    assert ConfigFilter.from_options({"select_numeric_notes": ["tensor_core"]}).rejects(cfg) is None
    why = ConfigFilter.from_options({"select_behavior_notes": ["DEVICE_SCALARS", "cuda_graph_capturable"]}).rejects(cfg)
    assert why is not None and "cuda_graph_capturable" in why
    why = ConfigFilter.from_options({"deselect_numeric_notes": NumericalNote.TENSOR_CORE}).rejects(cfg)
    assert why is not None and "tensor_core" in why
    assert "engine triton" in ConfigFilter.from_options({"deselect_engines": "triton"}).rejects(cfg)
    assert not ConfigFilter.from_options({}) and ConfigFilter.from_options({}).key() == ""


@pytest.mark.parametrize(
    "option,value",
    [
        ("deselect_numeric_notes", ["fast_math"]),
        ("deselect_engines", ["tensorrt"]),
        ("deselect_workspace_greater_than", -1),
        ("deselect_workspace_greater_than", "1MB"),
    ],
)
def test_bad_filter_values_are_typed_errors(option, value):
    with pytest.raises(og.AttributeValueError) as info:
        _relu_graph().build(device="cpu", **{option: value})
    assert info.value.rule == "build.filter" and option in str(info.value)


def test_a_filter_that_leaves_nothing_names_what_it_removed():
    with pytest.raises(og.UnsupportedGraphError) as info:
        _relu_graph().build(device="cpu", engines=["reference"], deselect_engines=["reference"])
    text = str(info.value)
    assert info.value.rule == "engine.no_config" and "filtered out: engine reference deselected" in text
    assert "relax the build's note, engine and workspace filters" in text


# -- on the interpreter (tier 2) --------------------------------------------------------------------------


@pytest.mark.interpreter
def test_deselected_behaviour_note_moves_pieces_to_another_engine(rng):
    g = _relu_graph()
    plan = g.build(device="cpu", engines=["triton", "torch"], deselect_behavior_notes=["interpreted"])
    assert [st.config.engine for st in plan.steps] == ["torch"]
    assert all(c.engine != "triton" for c in plan.steps[0].alternatives)
    assert not og.testing.check_plan(plan, rng)


@pytest.mark.interpreter
def test_workspace_limit_skips_configs_whose_kernels_need_more(rng):
    # the library config keeps the conv's output in its scratch; the torch config needs none
    plan = _conv_bias_relu().build(device="cpu", engines=["library", "torch"])
    assert plan.steps[0].config.engine == "library" and plan.workspace_size > 0
    plan = _conv_bias_relu().build(device="cpu", engines=["library", "torch"], deselect_workspace_greater_than=0)
    assert plan.steps[0].config.engine == "torch" and plan.workspace_size == 0
    assert not og.testing.check_plan(plan, rng)
    with pytest.raises(og.UnsupportedGraphError) as info:
        _conv_bias_relu().build(device="cpu", engines=["library"], deselect_workspace_greater_than=100)
    assert info.value.rule == "engine.workspace_limit" and "above the limit of 100" in str(info.value)


@pytest.mark.interpreter
def test_autotuning_times_only_what_passes_and_caches_apart(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path))
    timed = []
    real = autotune.time_kernel
    monkeypatch.setattr(autotune, "time_kernel", lambda k, *a: timed.append(k.config.engine) or real(k, *a))
    plan = _conv_bias_relu().build(
        device="cpu",
        engines=["triton", "library", "torch"],
        autotune=True,
        deselect_engines=["triton"],
        deselect_workspace_greater_than=0,
    )
    assert "triton" not in timed and "library" not in timed and timed  # library kernels need scratch
    assert plan.steps[0].config.engine == "torch"
    assert not og.testing.check_plan(plan, rng)
    timed.clear()
    unfiltered = _conv_bias_relu().build(device="cpu", engines=["triton", "library", "torch"], autotune=True)
    assert "triton" in timed  # not answered from the filtered build's cache entry
    assert_engine_matches(_conv_bias_relu(), rng, engines=("triton", "library", "torch"))
    entries = json.loads((tmp_path / "tuning.json").read_text())
    assert len(entries) == 2 and unfiltered.steps[0].config.measured_us is not None


@pytest.mark.interpreter
def test_deselecting_an_engine_removes_composites_that_run_its_code(rng):
    """A library config runs Triton (epilogue) and torch (conv) code: deselecting either removes it."""
    for gone, left in (("triton", "torch"), ("torch", "triton")):
        plan = _conv_bias_relu().build(
            device="cpu", engines=["triton", "library", "torch"], heur_mode=["B"], deselect_engines=[gone]
        )
        used = {st.config.engine for st in plan.steps} | {c.engine for st in plan.steps for c in st.alternatives}
        assert used == {left}, plan.describe()
        assert not og.testing.check_plan(plan, rng)
