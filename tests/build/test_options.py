"""Build options as one frozen, checked value (opgraph.build.options.BuildOptions), through
Graph.build's keywords or `options=`, to the planner."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import opgraph as og
from opgraph.build.options import NAMES, BuildOptions
from opgraph.build.planner import plan_steps


def _graph() -> og.Graph:
    g = og.Graph("opts", io_data_type=og.DataType.FLOAT)
    g.relu(g.exp(g.tensor(dim=[4, 8], name="x"))).set_output(True).set_name("y")
    return g


@pytest.mark.parametrize(
    "typo,meant",
    [
        ("devcie", "device"),
        ("autotun", "autotune"),
        ("by_ref", "by_reference"),
        ("deselect_engine", "deselect_engines"),
        ("heur_modes", "heur_mode"),
    ],
)
def test_an_unknown_keyword_is_a_typed_error_with_a_suggestion(typo, meant):
    with pytest.raises(og.BuildOptionError) as ei:
        _graph().build(device="cpu", **{typo: 1})
    err = ei.value
    assert isinstance(err, TypeError) and isinstance(err, og.AttributeValueError)  # Python's kind, and ours
    assert err.rule == "build.option" and f"did you mean '{meant}'" in str(err)
    assert "by_reference" in err.hint  # the list of options


def test_options_and_keywords_build_the_same_plan(rng):
    g = _graph()
    a = g.build(device="cpu", engines=["reference"], compile="serial")
    b = g.build(options=og.BuildOptions(device="cpu", engines=["reference"], compile="serial"))
    assert [s.config for s in a.steps] == [s.config for s in b.steps]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    ya, yb = np.full_like(x, np.nan), np.full_like(x, np.nan)
    a.execute({"x": x, "y": ya})
    b.execute({"x": x, "y": yb})
    np.testing.assert_array_equal(ya, yb)


def test_keywords_given_with_options_override_them():
    g = _graph()
    base = og.BuildOptions(device="cpu", engines=["torch"])
    assert g.build(options=base).steps[0].config.engine == "torch"
    assert g.build(engines=["reference"], options=base).steps[0].config.engine == "reference"
    plan = g.build(options=base, by_reference=True)
    assert all(t.is_by_reference for t in plan.graph.tensors.values() if not t.is_virtual)


def test_options_are_frozen_and_normalised_once():
    o = BuildOptions(heur_mode="b", engines="reference", autotune=1, deselect_numeric_notes=["tensor_core"])
    assert o.heur_mode == (og.HeurMode.B,) and o.engines == ("reference",) and o.autotune is True
    assert o.deselect_numeric_notes == frozenset({og.NumericalNote.TENSOR_CORE})
    assert o.filters.deselect_numeric_notes == o.deselect_numeric_notes
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.autotune = False  # type: ignore[misc]
    assert o.replace(autotune=False).autotune is False and o.autotune is True
    assert BuildOptions.of(o, device="cpu").as_keywords() == {
        "heur_mode": (og.HeurMode.B,),
        "device": "cpu",
        "engines": ("reference",),
        "autotune": True,
        "deselect_numeric_notes": frozenset({og.NumericalNote.TENSOR_CORE}),
    }
    assert set(NAMES) >= {
        "heur_mode",
        "device",
        "engines",
        "allow_partition",
        "autotune",
        "by_reference",
        "compile",
        "deselect_workspace_greater_than",
    }


@pytest.mark.parametrize(
    "keywords,error,rule",
    [
        ({"autotune": "yes"}, og.BuildOptionError, "build.option"),
        ({"by_reference": None}, og.BuildOptionError, "build.option"),
        ({"compile": "fast"}, og.BuildOptionError, "build.compile"),
        ({"device": 3}, og.BuildOptionError, "build.option"),
        ({"engines": [1, 2]}, og.BuildOptionError, "build.option"),
        ({"heur_mode": "Q"}, og.AttributeValueError, "heur_mode.unknown"),
        ({"deselect_engines": ["nope"]}, og.AttributeValueError, "build.filter"),
        ({"deselect_workspace_greater_than": -1}, og.AttributeValueError, "build.filter"),
    ],
)
def test_values_of_the_wrong_kind_are_refused_before_anything_is_built(keywords, error, rule):
    with pytest.raises(error) as ei:
        _graph().build(**{"device": "cpu", **keywords})
    assert ei.value.rule == rule
    with pytest.raises(error):
        BuildOptions.of(**keywords)


def test_options_must_be_build_options():
    with pytest.raises(og.BuildOptionError, match="not a BuildOptions"):
        _graph().build(options={"device": "cpu"})


def test_the_planner_takes_options_or_keywords():
    final = _graph().final
    a = plan_steps(final, BuildOptions(device="cpu", compile="lazy"))
    b = plan_steps(final, device="cpu", compile="lazy")
    assert [s.config for s in a.steps] == [s.config for s in b.steps] and a.stats["compile"]["mode"] == "lazy"
    with pytest.raises(og.BuildOptionError):
        plan_steps(final, devise="cpu")
