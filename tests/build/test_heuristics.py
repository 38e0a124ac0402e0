"""build.heuristics.rank_configs: configs ranked mode by mode in the engines' order, a rule of the
ranking policy moving an engine ahead (except in FALLBACK), declined engines with their reasons, no
config twice."""

from __future__ import annotations

import pytest

from opgraph.build.heuristics import PieceConfigs, rank_configs
from opgraph.build.policy import Match, Policy, Rule
from opgraph.core.config import EngineConfig, HeurMode
from opgraph.core.piece import make_piece

from .fakes import CPU, FakeEngine, at_most, chain

H = HeurMode


@pytest.fixture(scope="module")
def graph():
    return chain()


@pytest.fixture
def piece(graph):
    return make_piece(graph, 0, graph.nodes[:2])


def order(ranked: PieceConfigs) -> list[tuple[str, str]]:
    return [(c.engine, c.knob("mode")) for c in ranked.configs]


def test_modes_outer_engines_inner_in_the_given_order(piece):
    engines = [FakeEngine("p"), FakeEngine("q"), FakeEngine("r")]
    ranked = rank_configs(piece, engines, CPU, [H.B, H.INSTANT, H.FALLBACK])
    assert order(ranked) == [(e, m) for m in ("b", "instant", "fallback") for e in ("p", "q", "r")]
    assert ranked.piece is piece and ranked.declined == ()
    assert all(e.asked == [H.B, H.INSTANT, H.FALLBACK] for e in engines)
    reverse = rank_configs(piece, engines[::-1], CPU, [H.A])
    assert [c.engine for c in reverse.configs] == ["r", "q", "p"]


def leading(*names: str, **match) -> Policy:
    """A policy whose rules put `names` first on the pieces `match` holds for."""
    return Policy(tuple(Rule(n, Match(**match), True, f"{n} first") for n in names), {})


def test_a_rule_moves_an_engine_ahead_keeping_the_others_in_order(piece):
    engines = [FakeEngine("p"), FakeEngine("q"), FakeEngine("r"), FakeEngine("s")]
    ranked = rank_configs(piece, engines, CPU, [H.A], leading("s", "q"))
    assert [c.engine for c in ranked.configs] == ["q", "s", "p", "r"]  # a stable sort: q before s
    # a rule that does not hold for this piece leaves the order alone
    lone = [FakeEngine("p"), FakeEngine("q")]
    alone = leading("q", max_ops=1)
    assert [c.engine for c in rank_configs(piece, lone, CPU, [H.A], alone).configs] == ["p", "q"]
    one = make_piece(piece.graph, 0, piece.nodes[:1])
    assert [c.engine for c in rank_configs(one, lone, CPU, [H.A], alone).configs] == ["q", "p"]
    # the default policy has no rule for these engines
    assert [c.engine for c in rank_configs(one, lone, CPU, [H.A]).configs] == ["p", "q"]


def test_fallback_keeps_the_build_order_even_after_ruled_modes(piece):
    engines, policy = [FakeEngine("p"), FakeEngine("q")], leading("q")
    assert order(rank_configs(piece, engines, CPU, [H.FALLBACK], policy)) == [("p", "fallback"), ("q", "fallback")]
    both = rank_configs(piece, engines, CPU, [H.A, H.FALLBACK], policy)
    assert order(both) == [("q", "a"), ("p", "a"), ("p", "fallback"), ("q", "fallback")]
    instant_after = rank_configs(piece, engines, CPU, [H.FALLBACK, H.INSTANT], policy)
    assert order(instant_after) == [("p", "fallback"), ("q", "fallback"), ("q", "instant"), ("p", "instant")]


def test_declined_engines_keep_their_reasons_and_offer_nothing(piece):
    small = FakeEngine("small", at_most(1))
    engines = [small, FakeEngine("any"), FakeEngine("also_small", at_most(1))]
    ranked = rank_configs(piece, engines, CPU, [H.A, H.FALLBACK])
    assert ranked.declined == (("small", "at most 1 ops"), ("also_small", "at most 1 ops"))
    assert order(ranked) == [("any", "a"), ("any", "fallback")]
    assert small.asked == []  # FakeEngine.configs also asserts it is never asked about a declined piece
    text = str(ranked)
    assert text.splitlines()[0] == f"{piece.label()}:"
    assert "  0. any[mode=a]" in text and "  1. any[mode=fallback]" in text
    assert "  - small declined: at most 1 ops" in text and "  - also_small declined: at most 1 ops" in text
    nobody = rank_configs(piece, [small], CPU, [H.A])
    assert nobody.configs == () and len(nobody.declined) == 1


def test_a_config_offered_twice_is_listed_once_where_first_ranked(piece):
    def same_in_every_mode(pc, mode):
        return [
            EngineConfig("p", (("tile", 64),), why=f"first in {mode.name}"),
            EngineConfig("p", (("tile", 128),), why=mode.name),
        ]

    def duplicates_of_p(pc, mode):  # equal to p's configs except for the fields not compared
        return [
            EngineConfig("p", (("tile", 128),), why="q says so", measured_us=3.0),
            EngineConfig("q", (("tile", 32),)),
        ]

    engines = [FakeEngine("p", configs=same_in_every_mode), FakeEngine("q", configs=duplicates_of_p)]
    ranked = rank_configs(piece, engines, CPU, [H.A, H.B, H.FALLBACK])
    assert [(c.engine, c.knob("tile")) for c in ranked.configs] == [("p", 64), ("p", 128), ("q", 32)]
    assert ranked.configs[0].why == "first in A" and ranked.configs[1].why == "A"
    assert ranked.configs[1].measured_us is None  # the first one offered is kept, not the copy
    # a config differing in notes or estimate is a different config
    noted = EngineConfig("p", (("tile", 64),), estimate_us=1.0)
    engines = [FakeEngine("p", configs=same_in_every_mode), FakeEngine("q", configs=lambda pc, m: [noted])]
    assert noted in rank_configs(piece, engines, CPU, [H.A]).configs


def test_no_modes_no_configs(piece):
    engine = FakeEngine("p")
    assert rank_configs(piece, [engine], CPU, []).configs == () and engine.asked == []
