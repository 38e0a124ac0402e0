"""Measured preferences among a template's candidates, as data.

Candidates are ordered by one rule: a template ranks its configs by its cost model (`Match.estimate`, or
the ranked search over tile shapes of gemm_candidates / conv_fprop's conv_cost), then applies the
preferences of the table below that hold for the piece, in table order. A preference is named, says why
in one line and where its evidence is (bench/results/); its fitted thresholds are named constants of the
template that applies it. Two kinds:

- `Promote`: the first config that its tests pick (tried in order: a fallback after the preferred test)
  goes first; the others keep their order.
- `Place`: a group of variant configs (merged filter taps, the prologue pass) goes at a position: first,
  after the first n, or before the last (the broadest config, HeurMode.FALLBACK's pick, stays last).

    preference               template                        what
    SBR_CONV_LEAN            conv_fprop (GPU, image SBR)     the first config moving <= LEAN_PROLOGUE image
                                                             elements a thread a step, <= 3 stages, first
    MERGED_STEM              conv_fprop (C/groups < 8)       MERGE_TAPS configs first on the GPU for 16-bit
                                                             operands (by estimate), after 3 for others, before
                                                             the last on the CPU
    PROLOGUE_PASS_FIRST      conv_fprop, conv_wgrad (SBR)    the image prologue as its own pass first on the
                                                             GPU where the filter has several taps
    SBR_WGRAD_LEAN           conv_wgrad (GPU, image SBR)     the first config of the most taps a program under
                                                             LEAN_PROLOGUE, first
    MERGED_WGRAD             conv_wgrad (C/groups < 8)       MERGE_TAPS configs after the first (not timed yet)
    DGRAD_LOSS_PROLOGUE      conv_dgrad (GPU, DY prologue)   the first config of <= 128 rows first
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Preference:
    """A named preference: `why` in one line, `evidence` the bench/results/ file (and section) behind it."""

    name: str
    why: str
    evidence: str


@dataclass(frozen=True)
class Promote(Preference):
    def apply(self, configs: Sequence[T], *tests: Callable[[T], bool], among: int = -1) -> list[T]:
        """`configs` with the first of `configs[:among]` that a test picks (the tests tried in order) first."""
        pool = list(configs[:among]) if among else list(configs)
        for test in tests:
            picked = next((c for c in pool if test(c)), None)
            if picked is not None:
                return [picked, *(c for c in configs if c != picked)]
        return list(configs)


@dataclass(frozen=True)
class Place(Preference):
    def apply(self, configs: Sequence[T], group: Sequence[T], at: int) -> list[T]:
        """`configs` with `group` inserted at `at` (0: first; n: after the first n; -1: before the last)."""
        at = len(configs) + at if at < 0 else at
        return [*configs[:at], *group, *configs[at:]]


SBR_CONV_LEAN = Promote(
    "SBR_CONV_LEAN",
    "with a scale + bias + relu prologue on the image, tiles whose threads transform few image "
    "elements a step beat the cost model's pick",
    "bench/results/triton-preferences.md#sbr-conv-lean-tiles",
)
MERGED_STEM = Place(
    "MERGED_STEM",
    "a stem's few channels waste the K lanes of one tap a step; a filter row's taps and channels "
    "together fill them (2.4x on the 7x7 stem)",
    "bench/results/triton-preferences.md#merged-stem",
)
PROLOGUE_PASS_FIRST = Place(
    "PROLOGUE_PASS_FIRST",
    "a prologue fused on the image runs once per filter tap; run apart it runs once",
    "bench/results/triton-preferences.md#prologue-pass",
)
SBR_WGRAD_LEAN = Promote(
    "SBR_WGRAD_LEAN",
    "with SBR on the image, the most taps a program under a prologue budget a thread beat the cost model's pick",
    "bench/results/triton-preferences.md#sbr-wgrad-lean-taps",
)
MERGED_WGRAD = Place(
    "MERGED_WGRAD",
    "the stem's wgrad merged over taps and channels (untimed: after the heuristic's first, for the tuner)",
    "bench/results/triton-preferences.md#merged-wgrad",
)
DGRAD_LOSS_PROLOGUE = Promote(
    "DGRAD_LOSS_PROLOGUE",
    "a prologue on DY (relu_backward) runs on every A tile: at most 128 rows a tile",
    "bench/results/triton-preferences.md#dgrad-loss-prologue",
)
