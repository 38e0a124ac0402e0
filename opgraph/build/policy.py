"""The ranking policy: which engine's configs go first on a piece, as data.

The build offers engines in its order of preference (planner.default_engines: generated kernels first);
a rule of RULES may move an engine ahead on the pieces it matches. Engines report what they know about a
piece (`Engine.facts`: an estimate of its device time, facts such as cuDNN's runtime-fused epilogues);
the piece's shape is read here (`PieceFacts`); the rules decide:

- the first rule of an engine whose `Match` holds says whether it leads (`Rule.leads`);
- a leading engine still gives way where its estimated device time is below its LEAD_ABOVE_US: there,
  its host launch cost outweighs its device win (engines not named there lead whatever the estimate);
- engines that do not lead keep the build's order (a stable sort), and FALLBACK keeps it always
  (heuristics.rank_configs).

Each rule names the measurements it follows in bench/results/constants.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..core.dtypes import DataType
from ..engines.base import EngineFacts, PieceFact
from ..engines.shared.conv_shapes import CONV_KINDS, FEW_CHANNELS, NARROW_GROUP, ConvShape, conv_shape
from ..ops.layout import VIEW_KINDS

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.ir import Node
    from ..core.piece import Piece
    from ..engines.base import Engine

ATTENTION_KINDS = frozenset({"sdpa", "sdpa_backward"})
EVIDENCE = "bench/results/constants.md"

# Estimated device µs a piece must reach before an engine may lead on it: below it the engine's host
# launch cost outweighs its device win (a cuDNN plan's execute costs more host time than a generated
# kernel's native launch).
LEAD_ABOVE_US: Mapping[str, float] = MappingProxyType({"cudnn": 10.0, "library": 20.0})


@dataclass(frozen=True)
class PieceFacts:
    """What the rules read of a piece's shape: its anchor (the op its kernel is built around: the
    first attention node, else the first convolution, else the first matmul, else the first node),
    the anchor's convolution shape where it is one, the number of ops (views not counted: they are read
    in place or made by the kernel's library call), and whether the piece is
    planned for a dynamic plan's bucket whose shapes change the anchor's operands (`bucketed`)."""

    anchor: str
    ops: int
    conv: ConvShape | None = None
    bucketed: bool = False

    @classmethod
    def of(cls, piece: Piece) -> PieceFacts:
        nodes = piece.nodes
        anchor = (
            next((n for n in nodes if n.kind in ATTENTION_KINDS), None)
            or next((n for n in nodes if n.kind in CONV_KINDS), None)
            or next((n for n in nodes if n.kind == "matmul"), None)
            or nodes[0]
        )
        conv = conv_shape(piece, anchor) if anchor.kind in CONV_KINDS else None
        ops = sum(n.kind not in VIEW_KINDS for n in nodes)
        return cls(anchor.kind, ops, conv, _bucketed(piece, anchor))


def _bucketed(piece: Piece, anchor: Node) -> bool:
    """Whether a dim that varies over the piece's bucket sizes one of the anchor's operands."""
    origin = piece.graph.origin
    return origin is not None and origin.varies((*anchor.input_uids(), *anchor.output_uids()))


@dataclass(frozen=True)
class Match:
    """Which pieces a rule holds for: every field set must hold (None: any). The convolution fields
    hold only for a piece whose anchor is a convolution; `fact` where the rule's engine reports it."""

    kinds: frozenset[str] | None = None  # the anchor's op kind is one of these
    max_ops: int | None = None  # the piece has at most this many ops
    depthwise: bool | None = None  # one input channel per group
    grouped: bool | None = None  # more than one group
    channels_per_group_below: int | None = None
    image_types: frozenset[DataType] | None = None  # the data type of the conv's image
    filter_row_above: int | None = None  # taps on the filter's last spatial axis, more than
    fact: PieceFact | None = None
    bucketed: bool | None = None  # the piece is planned for a bucket of several shapes
    # the engine's estimate times this is at most the estimate of the engine the build prefers (`rival`)
    ahead_by: float | None = None

    def holds(
        self, piece: PieceFacts, reported: EngineFacts, rival: Callable[[], EngineFacts | None] | None = None
    ) -> bool:
        if self.kinds is not None and piece.anchor not in self.kinds:
            return False
        if self.bucketed is not None and piece.bucketed != self.bucketed:
            return False
        if self.max_ops is not None and piece.ops > self.max_ops:
            return False
        if self.fact is not None and self.fact not in reported.facts:
            return False
        if self.ahead_by is not None and not _ahead(reported, rival() if rival else None, self.ahead_by):
            return False
        conv = piece.conv
        checks = (self.depthwise, self.grouped, self.channels_per_group_below, self.image_types, self.filter_row_above)
        if all(c is None for c in checks):
            return True
        if conv is None:
            return False
        return (
            (self.depthwise is None or conv.depthwise == self.depthwise)
            and (self.grouped is None or conv.grouped == self.grouped)
            and (self.channels_per_group_below is None or conv.channels_per_group < self.channels_per_group_below)
            and (self.image_types is None or conv.image.data_type in self.image_types)
            and (self.filter_row_above is None or conv.filter_row > self.filter_row_above)
        )


def _ahead(reported: EngineFacts, rival: EngineFacts | None, by: float) -> bool:
    mine, theirs = reported.estimate_us, rival.estimate_us if rival else None
    return mine is not None and theirs is not None and mine * by <= theirs


@dataclass(frozen=True)
class Rule:
    """For pieces `match` holds for, whether `engine` leads. `pads_to`: the generated kernel pads each
    group's channels to this many, so the device time at stake (tested against LEAD_ABOVE_US) is the
    estimate times pads_to / channels per group. `why`: one line; `evidence`: where the measurements are."""

    engine: str
    match: Match
    leads: bool
    why: str
    pads_to: int | None = None
    evidence: str = ""

    def stake(self, piece: PieceFacts, estimate_us: float, rival_us: float | None = None) -> float:
        """The device time the rule's choice is about: the engine's estimate (padded where the generated
        kernel pads), or for an `ahead_by` rule the piece's time as the build's preferred engine runs it."""
        if self.match.ahead_by is not None and rival_us is not None:
            return rival_us
        if self.pads_to is None or piece.conv is None:
            return estimate_us
        return estimate_us * (self.pads_to / piece.conv.channels_per_group)


_FPROP = frozenset({"conv_fprop"})
RULES: tuple[Rule, ...] = (
    Rule(
        "cudnn",
        Match(kinds=ATTENTION_KINDS, bucketed=True, fact=PieceFact.ONE_PLAN_PER_BUCKET),
        True,
        "attention in a bucket of several shapes, in cuDNN's padded form: one plan built at the bucket's "
        "largest shape serves every shape (lengths and ragged offsets written per shape), faster than the "
        "generated kernel on long sequences",
        evidence=f"{EVIDENCE}#bucket-attention",
    ),
    Rule(
        "cudnn",
        Match(kinds=ATTENTION_KINDS, bucketed=True),
        False,
        "attention in a bucket of several shapes that cuDNN's padded form does not take: a cuDNN plan is "
        "built again at each new shape, the generated kernel (taking its sizes at run time) serves them all",
        evidence=f"{EVIDENCE}#bucket-attention",
    ),
    Rule(
        "cudnn",
        Match(kinds=ATTENTION_KINDS),
        True,
        "cuDNN's fused attention leads where the piece is worth its launch",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "cudnn",
        Match(kinds=CONV_KINDS, depthwise=True),
        False,
        "depthwise convolutions: the generated kernels'",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "cudnn",
        Match(kinds=_FPROP, grouped=True, channels_per_group_below=NARROW_GROUP),
        True,
        "narrow groups: the generated kernel pads its K tile, cuDNN leads unless tiny",
        pads_to=NARROW_GROUP,
        evidence=f"{EVIDENCE}#narrow-groups",
    ),
    Rule(
        "cudnn",
        Match(kinds=_FPROP, fact=PieceFact.RUNTIME_FUSED_EPILOGUE),
        False,
        "a residual add or per-channel scale after the conv: cuDNN's runtime-fusion plans are slower",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "cudnn",
        Match(kinds=_FPROP, channels_per_group_below=FEW_CHANNELS, image_types=frozenset({DataType.BFLOAT16})),
        False,
        "a bf16 stem: cuDNN's bf16 plans for few channels are slow",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "cudnn",
        Match(kinds=_FPROP, channels_per_group_below=FEW_CHANNELS, filter_row_above=1),
        False,
        "a stem with a filter row of several taps: the generated kernel's MERGE_TAPS configs win",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "cudnn",
        Match(kinds=CONV_KINDS),
        True,
        "convolutions: cuDNN's plans beat the generated kernels where worth a launch",
        evidence=f"{EVIDENCE}#cudnn-leads",
    ),
    Rule(
        "library",
        Match(kinds=frozenset({"matmul"}), max_ops=1, fact=PieceFact.NATIVE_GEMM),
        True,
        "a lone 16-bit matmul (nothing to fuse around it): cuBLAS's kernels run 4-15% faster than the "
        "generated ones where worth its launch; in a dynamic plan's bucket too (the call takes every "
        "shape, nothing compiled)",
        evidence=f"{EVIDENCE}#lone-matmuls",
    ),
    Rule(
        "library",
        Match(kinds=frozenset({"matmul"}), ahead_by=1.2, bucketed=False),
        True,
        "a matmul the cost model puts 20% faster as cuBLAS plus its epilogue than generated (a long K over "
        "too few output tiles to fill the GPU: a weight gradient)",
        evidence=f"{EVIDENCE}#hopper-small-tiles",
    ),
)


@dataclass(frozen=True)
class Policy:
    """Rules (the first of an engine that holds decides) and per-engine launch thresholds."""

    rules: tuple[Rule, ...] = RULES
    lead_above_us: Mapping[str, float] = field(default_factory=lambda: LEAD_ABOVE_US)

    def leads(
        self,
        piece: Piece,
        engine: Engine,
        device: Device,
        facts: PieceFacts | None = None,
        preferred: Engine | None = None,
    ) -> bool:
        """Whether `engine`'s configs go before those of engines the build prefers to it (`preferred`: the
        first of them, whose estimate `ahead_by` rules compare with)."""
        facts = facts or PieceFacts.of(piece)
        rival = _Rival(piece, preferred if preferred is not engine else None, device)
        found = self.decide(piece, facts, engine, device, rival)
        if found is None:
            return False
        rule, reported = found
        if not rule.leads:
            return False
        bar = self.lead_above_us.get(engine.name)
        if bar is None:
            return True
        theirs = rival() if rule.match.ahead_by is not None else None
        return reported.estimate_us is not None and (
            rule.stake(facts, reported.estimate_us, theirs.estimate_us if theirs else None) >= bar
        )

    def decide(
        self,
        piece: Piece,
        facts: PieceFacts,
        engine: Engine,
        device: Device,
        rival: Callable[[], EngineFacts | None] | None = None,
    ) -> tuple[Rule, EngineFacts] | None:
        """The engine's first rule that holds for the piece, with the engine's report (None: none holds)."""
        mine = [r for r in self.rules if r.engine == engine.name]
        if not mine:
            return None
        reported = engine.facts(piece, device)
        for rule in mine:
            if rule.match.holds(facts, reported, rival):
                return rule, reported
        return None

    def order(self, piece: Piece, engines: Sequence[Engine], device: Device) -> list[Engine]:
        """`engines` with those that lead on the piece first, each group in the given order."""
        facts = PieceFacts.of(piece)
        first = engines[0] if engines else None
        return sorted(engines, key=lambda e: not self.leads(piece, e, device, facts, first))


class _Rival:
    """The preferred engine's report on the piece, asked once and only if a rule compares with it."""

    def __init__(self, piece: Piece, engine: Engine | None, device: Device) -> None:
        self.piece, self.engine, self.device = piece, engine, device
        self.asked = False
        self.reported: EngineFacts | None = None

    def __call__(self) -> EngineFacts | None:
        if not self.asked and self.engine is not None:
            self.reported = self.engine.facts(self.piece, self.device)
        self.asked = True
        return self.reported


POLICY = Policy()

__all__ = ["EVIDENCE", "LEAD_ABOVE_US", "POLICY", "RULES", "Match", "PieceFacts", "Policy", "Rule"]
