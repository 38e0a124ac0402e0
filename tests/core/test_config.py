"""core.config: heuristic modes as users give them (as_modes), Support verdicts and EngineConfig (knobs,
equality that ignores the heuristic's reason and timings, its one-line description)."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.config import (
    DEFAULT_MODES,
    BehaviorNote,
    EngineConfig,
    HeurMode,
    NumericalNote,
    Support,
    as_modes,
)

from ..helpers import check_rule

H = HeurMode


@pytest.mark.parametrize(
    "given,want",
    [
        (None, DEFAULT_MODES),
        (H.B, (H.B,)),
        ("instant", (H.INSTANT,)),
        (" Fallback ", (H.FALLBACK,)),
        ("A", (H.A,)),
        ([H.A, "b", "FALLBACK"], (H.A, H.B, H.FALLBACK)),
        ((H.FALLBACK, H.A), (H.FALLBACK, H.A)),
        (iter(["a"]), (H.A,)),
        ([], ()),
    ],
    ids=lambda v: "iterator" if hasattr(v, "__next__") else repr(v),
)
def test_as_modes_accepts_modes_names_and_lists_of_them(given, want):
    assert as_modes(given) == want


def test_default_modes():
    assert DEFAULT_MODES == (H.A, H.FALLBACK)


@pytest.mark.parametrize(
    "bad,shown",
    [
        ("C", "'C'"),
        ("heur_mode_a", "'heur_mode_a'"),
        (3, "3"),
        ([3], "3"),
        ([H.A, None], "None"),
        ([H.A, "x"], "'x'"),
        (b"a", "b'a'"),
        (2.5, "2.5"),
        (["A", ["B"]], "['B']"),
    ],
    ids=repr,
)
def test_as_modes_refuses_anything_else_naming_it(bad, shown):
    with pytest.raises(og.AttributeValueError) as err:
        as_modes(bad)
    check_rule(err.value, "heur_mode.unknown")
    assert f"heur_mode {shown} is not a heuristic mode" in str(err.value)
    assert "INSTANT, A, B, FALLBACK" in err.value.hint


def test_heur_mode_repr_is_its_python_spelling():
    assert [repr(m) for m in H] == ["HeurMode.INSTANT", "HeurMode.A", "HeurMode.B", "HeurMode.FALLBACK"]


def test_support_is_truthy_only_when_ok():
    node = object()
    assert Support.yes() and Support.yes().reason == ""
    no = Support.no("too big", node)  # type: ignore[arg-type]
    assert not no and no.reason == "too big" and no.node is node
    assert no == Support.no("too big")  # the node at fault is not part of the verdict's identity
    assert no != Support.no("too small")


def test_engine_config_knobs():
    c = EngineConfig("triton", (("template", "gemm"), ("block_m", 64)))
    assert c.knob("block_m") == 64 and c.knob("template") == "gemm"
    assert c.knob("missing") is None and c.knob("missing", 3) == 3


def test_engine_configs_equal_whatever_the_reason_and_the_timing():
    a = EngineConfig("triton", (("b", 1),), why="rule 1", measured_us=3.0)
    b = EngineConfig("triton", (("b", 1),), why="rule 2")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    for other in (
        EngineConfig("torch", (("b", 1),)),
        EngineConfig("triton", (("b", 2),)),
        EngineConfig("triton", (("b", 1),), estimate_us=1.0),
        EngineConfig("triton", (("b", 1),), numerical_notes=frozenset({NumericalNote.TENSOR_CORE})),
    ):
        assert other != a


def test_engine_config_describes_itself_in_one_line():
    assert str(EngineConfig("reference")) == "reference"
    c = EngineConfig(
        "triton",
        (("template", "gemm"), ("block_m", 64)),
        numerical_notes=frozenset({NumericalNote.TENSOR_CORE, NumericalNote.DOWN_CONVERT_INPUTS}),
        behavior_notes=frozenset({BehaviorNote.RUNTIME_COMPILATION}),
        estimate_us=12.345,
    )
    assert str(c) == (
        "triton[template=gemm block_m=64] ~12.3us est. (down_convert_inputs, runtime_compilation, tensor_core)"
    )
    timed = EngineConfig("torch", estimate_us=None, measured_us=7.06)
    assert str(timed) == "torch 7.1us measured"
