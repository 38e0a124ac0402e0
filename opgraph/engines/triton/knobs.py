"""The Triton engine's tuning vocabulary: every knob a generated kernel takes, typed, one frozen dataclass
per template family, each field a knob named as it is stored in `EngineConfig.knobs` and plan files.

A field is None where a config does not set the knob (the template's default applies, the field's comment
names it): a config stores only the knobs it sets (`Knobs.pairs`), exactly as the configs of earlier
versions did, so their plan files keep loading and configs compare equal. Values are checked once, when
a knob set is made (`__post_init__`); what depends on the piece (TAPS dividing the filter's taps, a
prologue to run apart) is the template's match's to check.

    family          templates                                 knobs
    TileKnobs       matmul, conv_fprop, conv_dgrad,           BLOCK_M BLOCK_N BLOCK_K GROUP_M SPLIT_K num_warps
                    conv_wgrad, depthwise (pixel tiles)       num_stages PERSISTENT FLATTEN TMA TMA_HOST WS
                                                              EPILOGUE_SUBTILE EPI_M EPI_N fp32_precision PHASES
                                                              TAPS COMBINE_M COMBINE_N MERGE_TAPS PROLOGUE_PASS
                                                              WCOPY UNROLL
    RowStripKnobs   depthwise (row strips)                    ROWS BLOCK_W BLOCK_N num_warps num_stages MAXNREG
    FlatKnobs       pooling, pool_backward                    BLOCK num_warps
    PointwiseKnobs  pointwise                                 BLOCK TILE_I TILE_J ROWS COLS num_warps
    ScatterKnobs    embedding_backward                        ROWS BLOCK ZERO num_warps
    ReductionKnobs  reduction                                 BLOCK_M BLOCK_K SPLIT num_warps STAGES
    RownormKnobs    rownorm                                   BLOCK ROWS W PROGRAMS RB BW ST PF FP BH BG SW
    StatsKnobs      norm_stats                                BR BC CHUNK W ST PF ABR ABC AW BS CW ORDER
    FwdKnobs        attention (attention/spec.py)             BLOCK_M BLOCK_N num_warps num_stages TMA ORDER
                                                              ONELOOP fp32_precision SPLIT PACK_GQA
    BwdKnobs        attention_bwd (attention/spec.py)         BLOCK_M1 BLOCK_N1 BLOCK_M2 BLOCK_N2 W1 S1 W2 S2
                                                              PRE_BLOCK TMA FUSED ONELOOP fp32_precision

The same name may mean different things in two families (ROWS: output rows of a depthwise strip, rows
of a pointwise tile, rows of a rownorm tile): a knob's meaning is its family's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from ...core.errors import AttributeValueError

K = TypeVar("K", bound="Knobs")

SMEM_LIMIT = 225 * 1024  # H100/H200: 227 KiB of shared memory a block, less a margin for Triton's own buffers


@dataclass(frozen=True)
class Knobs:
    """A knob set of one template family (subclasses are the families). `pairs()` is its stored form,
    `parse` reads a stored form back (typed errors for unknown names, missing or bad values)."""

    TEXT: ClassVar[frozenset[str]] = frozenset({"fp32_precision"})  # knobs whose values are strings
    # knobs the build's policy chooses, not the engine's heuristic: a candidate setting one is offered
    # beside the heuristic's pick (mode A), never as the pick or FALLBACK's broadest config
    CHOICES: ClassVar[frozenset[str]] = frozenset()

    def chosen_by_policy(self) -> bool:
        return any(getattr(self, n, None) is not None for n in self.CHOICES)

    # knobs of kernel variants offered for tuning until measured (a set one makes the config no fallback)
    UNMEASURED: ClassVar[frozenset[str]] = frozenset()

    def unmeasured(self) -> bool:
        return any(getattr(self, n, None) for n in self.UNMEASURED)

    def pairs(self) -> tuple[tuple[str, Any], ...]:
        """(name, value) of the knobs this set gives, sorted by name: what EngineConfig.knobs stores."""
        return tuple(sorted((f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None))

    def replace(self: K, **changes: Any) -> K:
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls: type[K], knobs: Mapping[str, Any], template: str = "") -> K:
        """The knob set a stored config gives (its ("template", name) pair left out)."""
        names = [f.name for f in fields(cls)]
        where = f"the {template} template" if template else cls.__name__
        unknown = sorted(set(knobs) - set(names))
        if unknown:
            raise AttributeValueError(
                f"{', '.join(unknown)}: not a knob of {where} (its knobs: {', '.join(names)})",
                rule="triton.knob",
                hint="take configs from engine_configs() or from a plan this version built, or drop the knob",
            )
        values: dict[str, Any] = {}
        for name, value in knobs.items():
            try:
                values[name] = value if value is None else str(value) if name in cls.TEXT else int(value)
            except (TypeError, ValueError):
                raise AttributeValueError(
                    f"{name}={value!r} is not a number ({where})", rule="triton.knob", hint=f"give {name} as an integer"
                ) from None
        missing = [f.name for f in fields(cls) if f.name not in values and f.default is dataclasses.MISSING]
        if missing:
            raise AttributeValueError(
                f"{where} needs the knob(s) {', '.join(missing)}",
                rule="triton.knob",
                hint="take configs from engine_configs() or from a plan this version built",
            )
        return cls(**values)


def _power_of_two(name: str, value: int | None, least: int, rule: str, hint: str, why: str = "") -> None:
    if value is not None and (value < least or value & (value - 1)):
        raise AttributeValueError(f"{name}={value} must be a power of two >= {least}{why}", rule=rule, hint=hint)


def _one_of(name: str, value: Any, allowed: tuple[Any, ...], rule: str, hint: str) -> None:
    if value is not None and value not in allowed:
        raise AttributeValueError(
            f"{name}={value!r} must be one of {', '.join(map(repr, allowed))}", rule=rule, hint=hint
        )


def _at_least(name: str, value: int | None, least: int, rule: str, hint: str) -> None:
    if value is not None and value < least:
        raise AttributeValueError(f"{name}={value} must be >= {least}", rule=rule, hint=hint)


def _warps(value: int | None, rule: str) -> None:
    _power_of_two("num_warps", value, 1, rule, "use 1, 2, 4, 8 or 16 warps a program")


@dataclass(frozen=True)
class TileKnobs(Knobs):
    """A GEMM-class kernel (gemm/): one BLOCK_M x BLOCK_N tile of the output space per program (per loop
    step of a persistent program), a main loop over K in BLOCK_K steps, the shared epilogue."""

    BLOCK_M: int  # tile rows (a power of two >= 16)
    BLOCK_N: int  # tile columns
    BLOCK_K: int | None = None  # K a main-loop step covers (a stencil with no K loop has none; >= 16 for tl.dot)
    GROUP_M: int | None = None  # group-M swizzle of the tile order, for L2 reuse (8)
    SPLIT_K: int | None = None  # programs the main loop is split over, fp32 partials summed in fixed order (1)
    num_warps: int | None = None  # (4)
    num_stages: int | None = None  # software-pipeline depth of the main loop (2; the cost models assume 3)
    PERSISTENT: int | None = None  # 0: a program per tile; P: P programs loop over the tiles (0)
    FLATTEN: int | None = None  # 1: a persistent kernel's tile and K loops pipelined as one (0)
    TMA: int | None = None  # 1: operands read through device-side tensor descriptors where they allow (matmul; 0)
    TMA_HOST: int | None = None  # 1 (with TMA=1): those descriptors made at bind, kernel arguments (matmul; 0)
    EPILOGUE_SUBTILE: int | None = None  # 2: the epilogue runs on column halves of the tile (1)
    # 1 (with TMA_HOST=1 and PERSISTENT): a Gluon kernel, warp-specialized: a TMA loader warp filling num_stages
    # shared-memory stages, the num_warps consumer warps multiplying (async wgmma) and running the epilogue (matmul; 0)
    WS: int | None = None
    EPI_M: int | None = None  # rows of the split-K epilogue launch's tiles (derived: ~2 programs per SM)
    EPI_N: int | None = None  # its columns
    fp32_precision: str | None = None  # fp32 operands: "tf32" (tensor cores) or "ieee" ("tf32")
    # fp8 x fp8 on Hopper: K elements the tensor cores sum in their own reduced-precision accumulator before
    # the sum joins the fp32 one (32 .. BLOCK_K); 0: the whole loop (cuBLAS's fast accumulation, noted) (BLOCK_K)
    FP8_ACC: int | None = None
    PHASES: int | None = None  # conv_dgrad, stride > 1: 1 programs per stride phase (no holes), 0 masked (1)
    TAPS: int | None = None  # conv_wgrad: filter taps a program accumulates, one DY tile for all (1)
    COMBINE_M: int | None = None  # conv_wgrad: rows of the combine launch's tiles (derived)
    COMBINE_N: int | None = None  # its columns
    MERGE_TAPS: int | None = None  # conv_fprop / conv_wgrad: 1 runs K lanes over taps and channels together (0)
    PROLOGUE_PASS: int | None = None  # conv_fprop / conv_wgrad: 1 runs the image prologue as its own pass (0)
    WCOPY: int | None = None  # depthwise pixel tiles: 1 reads the filter from a tap-major fp32 copy made first (0)
    UNROLL: int | None = None  # depthwise pixel tiles: 1 unrolls every tap; else > 32 loop but the last axis (0)

    RULE: ClassVar[str] = "triton.gemm.knob"

    def __post_init__(self) -> None:
        rule = self.RULE
        for key in ("BLOCK_M", "BLOCK_N", "EPI_M", "EPI_N", "COMBINE_M", "COMBINE_N"):
            _power_of_two(
                key,
                getattr(self, key),
                16,
                rule,
                f"pick {key} from 16, 32, 64, 128, 256",
                " (tl.dot and tl.arange need it)",
            )
        _power_of_two("BLOCK_K", self.BLOCK_K, 8, rule, "pick BLOCK_K from 16, 32, 64, 128 (8: stencils only)")
        _at_least("GROUP_M", self.GROUP_M, 1, rule, "use 1 (no swizzle) or 8")
        _at_least("SPLIT_K", self.SPLIT_K, 1, rule, "use 1 (no split) or a small factor such as 2-8")
        _at_least("TAPS", self.TAPS, 1, rule, "use 1 or a divisor of the filter's taps")
        _warps(self.num_warps, rule)
        _at_least("num_stages", self.num_stages, 1, rule, "use 1-4 stages")
        if self.PERSISTENT is not None and self.PERSISTENT < 0:
            raise AttributeValueError(
                f"PERSISTENT={self.PERSISTENT} must be 0 (one tile per program) or the number of programs",
                rule=rule,
                hint="use 0, or about the number of SMs (times the programs per SM)",
            )
        if self.FLATTEN not in (None, 0, 1) or (self.FLATTEN and (not self.persistent or self.split_k > 1)):
            # (a split of K has empty K ranges, which Triton's loop flattening has miscompiled: triton#11656)
            raise AttributeValueError(
                f"FLATTEN={self.FLATTEN} must be 0, or 1 with PERSISTENT and SPLIT_K=1",
                rule=rule,
                hint="FLATTEN flattens a persistent kernel's tile loop",
            )
        if self.EPILOGUE_SUBTILE not in (None, 1, 2):
            raise AttributeValueError(
                f"EPILOGUE_SUBTILE={self.EPILOGUE_SUBTILE} must be 1 or 2",
                rule=rule,
                hint="use 2 to run the epilogue on column halves",
            )
        if self.fp32_precision not in (None, "tf32", "ieee"):
            raise AttributeValueError(
                f"fp32_precision={self.fp32_precision!r} is not 'tf32' or 'ieee'",
                rule="triton.gemm.fp32_precision",
                hint="use 'tf32' (tensor cores, 10-bit mantissa inputs) or 'ieee' (full fp32)",
            )
        if self.FP8_ACC is not None and self.FP8_ACC != 0:
            _power_of_two("FP8_ACC", self.FP8_ACC, 32, rule, "use 0 (fast accumulation) or 32 .. BLOCK_K")
            if self.BLOCK_K is not None and self.FP8_ACC > self.BLOCK_K:
                raise AttributeValueError(
                    f"FP8_ACC={self.FP8_ACC} is more than BLOCK_K={self.BLOCK_K}: the tensor cores' sum joins the "
                    "fp32 accumulator at least once a main-loop step",
                    rule=rule,
                    hint="use 0 (fast accumulation) or a power of two from 32 to BLOCK_K",
                )
        for key in ("TMA", "TMA_HOST", "WS", "PHASES", "MERGE_TAPS", "PROLOGUE_PASS", "WCOPY", "UNROLL"):
            _one_of(key, getattr(self, key), (0, 1), rule, f"use {key}=0 or 1")
        if self.TMA_HOST and not self.TMA:
            raise AttributeValueError(
                f"TMA_HOST={self.TMA_HOST} needs TMA=1 (it says where TMA's descriptors are made)",
                rule=rule,
                hint="add TMA=1, or drop TMA_HOST",
            )
        if self.WS and not (self.TMA_HOST and self.persistent and self.split_k == 1 and not self.FLATTEN):
            raise AttributeValueError(
                f"WS={self.WS} needs TMA=1, TMA_HOST=1, PERSISTENT, SPLIT_K=1 and no FLATTEN (its loader warp reads "
                "the operands through host descriptors, its programs loop over the tiles)",
                rule=rule,
                hint="add TMA=1 TMA_HOST=1 PERSISTENT=<SMs>, drop SPLIT_K and FLATTEN, or drop WS",
            )

    # the values in effect (the defaults of knobs a config leaves out)
    @property
    def group_m(self) -> int:
        return 8 if self.GROUP_M is None else self.GROUP_M

    @property
    def split_k(self) -> int:
        return self.SPLIT_K or 1

    @property
    def warps(self) -> int:
        return self.num_warps or 4

    @property
    def stages(self) -> int:
        return self.num_stages or 2

    @property
    def persistent(self) -> int:
        return self.PERSISTENT or 0

    @property
    def subtile(self) -> int:
        return self.EPILOGUE_SUBTILE or 1

    @property
    def precision(self) -> str:
        return self.fp32_precision or "tf32"

    @property
    def taps(self) -> int:
        return self.TAPS or 1

    @property
    def tma(self) -> bool:
        return bool(self.TMA)

    @property
    def tma_host(self) -> bool:
        return bool(self.TMA_HOST)

    @property
    def ws(self) -> bool:
        return bool(self.WS)

    @property
    def merged(self) -> bool:
        return bool(self.MERGE_TAPS)

    @property
    def prologue_pass(self) -> bool:
        return bool(self.PROLOGUE_PASS)

    @property
    def phases(self) -> bool:
        return self.PHASES is None or bool(self.PHASES)


@dataclass(frozen=True)
class RowStripKnobs(Knobs):
    """The depthwise row-strip kernel (templates/depthwise.py): a program owns BLOCK_W output pixels along W x
    BLOCK_N channels of ROWS consecutive output rows and walks the input rows once."""

    ROWS: int  # output rows a program computes (> 0; a stored ROWS=0 means pixel tiles: TileKnobs)
    BLOCK_W: int  # output pixels of a strip (a power of two)
    BLOCK_N: int  # channels (a power of two)
    num_warps: int | None = None  # (4)
    num_stages: int | None = None  # input rows in flight in the pipelined row loop (3)
    MAXNREG: int | None = None  # a register cap for ptxas (none)
    # 1: the R x S weight vectors are loaded (L1 hits) at every input row instead of kept in registers
    # from the start: filters of more than templates/depthwise.py's ROW_TAPS taps (7x7)
    WLOAD: int | None = None

    UNMEASURED: ClassVar[frozenset[str]] = frozenset({"WLOAD"})

    def __post_init__(self) -> None:
        rule = "triton.depthwise.knob"
        _at_least("ROWS", self.ROWS, 1, rule, "use ROWS >= 1, or pixel tiles (no ROWS)")
        _one_of("WLOAD", self.WLOAD, (0, 1), rule, "use WLOAD=1 to load the weights at every row, or drop it")
        for key in ("BLOCK_W", "BLOCK_N"):
            _power_of_two(key, getattr(self, key), 1, rule, f"pick {key} from 8, 16, 32, 64")
        _warps(self.num_warps, rule)
        _at_least("num_stages", self.num_stages, 1, rule, "use 1-4 stages")
        _at_least("MAXNREG", self.MAXNREG, 0, rule, "use 0 (no cap) or a register count such as 128")

    @property
    def warps(self) -> int:
        return self.num_warps or 4

    @property
    def stages(self) -> int:
        return self.num_stages or 3


@dataclass(frozen=True)
class FlatKnobs(Knobs):
    """A kernel over flat output elements (pooling, pool_backward): BLOCK elements a program."""

    BLOCK: int  # output elements a program (a power of two)
    num_warps: int | None = None  # (4)

    def __post_init__(self) -> None:
        _power_of_two("BLOCK", self.BLOCK, 1, "triton.knob", "pick BLOCK from 256, 512, 1024, 2048")
        _warps(self.num_warps, "triton.knob")

    @property
    def warps(self) -> int:
        return self.num_warps or 4


@dataclass(frozen=True)
class ScatterKnobs(Knobs):
    """The embedding backward's scatter-add (templates/embedding_backward.py): ROWS rows of the gradient a
    program, BLOCK columns of them, each added to the table row its index names; ZERO elements a program of
    the launch zeroing the table first."""

    ROWS: int  # gradient rows (tokens) a program (a power of two)
    BLOCK: int  # columns a program (a power of two)
    ZERO: int  # table elements a program of the zeroing launch (a power of two)
    num_warps: int | None = None  # (4)

    def __post_init__(self) -> None:
        for key in ("ROWS", "BLOCK", "ZERO"):
            _power_of_two(key, getattr(self, key), 1, "triton.scatter.knob", f"pick {key} a power of two")
        _warps(self.num_warps, "triton.scatter.knob")

    @property
    def warps(self) -> int:
        return self.num_warps or 4


@dataclass(frozen=True)
class PointwiseKnobs(Knobs):
    """The pointwise template's walks: flat (BLOCK elements a program), tiled over a transposed tensor's two
    contiguous axes (TILE_I x TILE_J) or over rows (ROWS x COLS of the first output's two innermost axes); the
    flat walk with PARTS: a concatenation's axis walked in PARTS parts of equal width, each computed without
    selects (pointwise.py's part walk)."""

    BLOCK: int | None = None  # the flat walk: elements a program (with PARTS: of each part)
    PARTS: int | None = None  # the part walk: parts of the concatenated axis (the piece's own count)
    TILE_I: int | None = None  # the transposed walk: tile extent along the transposed tensor's contiguous axis
    TILE_J: int | None = None  # ... along the first output's
    ROWS: int | None = None  # the row walk: rows a tile
    COLS: int | None = None  # ... columns a tile
    num_warps: int | None = None  # (4)

    def __post_init__(self) -> None:
        for key in ("BLOCK", "TILE_I", "TILE_J", "ROWS", "COLS"):
            _power_of_two(key, getattr(self, key), 1, "triton.pointwise.knob", f"pick {key} a power of two")
        _at_least("PARTS", self.PARTS, 2, "triton.pointwise.knob", "use PARTS >= 2 with BLOCK, or drop it")
        _warps(self.num_warps, "triton.pointwise.knob")
        if self.PARTS is not None and self.BLOCK is None:
            raise AttributeValueError(
                "PARTS is the flat walk's (BLOCK elements of each part a program)",
                rule="triton.pointwise.knob",
                hint="give BLOCK with PARTS, or take configs from engine_configs()",
            )
        walks = [
            w
            for w, given in (
                ("BLOCK", self.BLOCK),
                ("TILE_I/TILE_J", self.TILE_I or self.TILE_J),
                ("ROWS/COLS", self.ROWS or self.COLS),
            )
            if given
        ]
        if (
            len(walks) != 1
            or (self.TILE_I is None) != (self.TILE_J is None)
            or (self.ROWS is None) != (self.COLS is None)
        ):
            raise AttributeValueError(
                f"a pointwise config walks one way: BLOCK, or TILE_I and TILE_J, or ROWS and "
                f"COLS (this one gives {', '.join(walks) or 'none'})",
                rule="triton.pointwise.knob",
                hint="take configs from engine_configs()",
            )

    @property
    def warps(self) -> int:
        return self.num_warps or 4


@dataclass(frozen=True)
class ReductionKnobs(Knobs):
    """The reduction template: BLOCK_M kept positions x BLOCK_K reduced ones a tile, K split over SPLIT
    programs (partials combined by a second launch), the K loop pipelined STAGES deep."""

    BLOCK_M: int  # kept positions a program (a power of two)
    BLOCK_K: int  # reduced positions a step
    SPLIT: int | None = None  # programs along K (1)
    num_warps: int | None = None  # (4)
    STAGES: int | None = None  # 0: a plain loop; else tl.range(num_stages=STAGES) (0)

    def __post_init__(self) -> None:
        for key in ("BLOCK_M", "BLOCK_K"):
            _power_of_two(key, getattr(self, key), 1, "triton.reduction.knob", f"pick {key} a power of two")
        _at_least("SPLIT", self.SPLIT, 1, "triton.reduction.knob", "use 1 (no split) or more programs along K")
        _at_least("STAGES", self.STAGES, 0, "triton.reduction.knob", "use 0 (a plain loop) or 2-6")
        _warps(self.num_warps, "triton.reduction.knob")

    @property
    def split(self) -> int:
        return self.SPLIT or 1

    @property
    def warps(self) -> int:
        return self.num_warps or 4

    @property
    def stages(self) -> int:
        return self.STAGES or 0


@dataclass(frozen=True)
class RownormKnobs(Knobs):
    """The rownorm template (layernorm / rmsnorm forward and backward, templates/rownorm.py)."""

    BLOCK: int  # a row's columns, padded to a power of two
    ROWS: int  # rows a tile
    W: int  # warps of the forward row kernel
    PROGRAMS: int  # backward: programs walking the rows
    RB: int  # rows a backward step
    BW: int  # warps of a backward program
    BH: int  # backward's second launch: columns a program
    SW: int  # ... its warps
    ST: int | None = None  # software-pipeline depth of the row loop (0: none) (0)
    PF: int | None = None  # 1: register double buffering of the next rows instead (0)
    FP: int | None = None  # forward: persistent programs (0: a tile per program) (0)
    BG: int | None = None  # backward's second launch: partial rows a step (derived)

    def __post_init__(self) -> None:
        _power_of_two("BLOCK", self.BLOCK, 1, "triton.rownorm.knob", "BLOCK is the row's power of two")


@dataclass(frozen=True)
class ScanKnobs(Knobs):
    """The scan template (cumsum, templates/scan.py): [ROWS, BLOCK] tiles, the scanned axis walked in
    chunks of BLOCK with a running carry per row."""

    ROWS: int  # rows (positions of the kept axes) a program
    BLOCK: int  # elements of the scanned axis a step (a power of two)
    num_warps: int | None = None  # (4)

    def __post_init__(self) -> None:
        for key in ("ROWS", "BLOCK"):
            _power_of_two(key, getattr(self, key), 1, "triton.scan.knob", f"pick {key} a power of two")
        _warps(self.num_warps, "triton.scan.knob")

    @property
    def warps(self) -> int:
        return self.num_warps or 4


@dataclass(frozen=True)
class StatsKnobs(Knobs):
    """The norm_stats template (batchnorm / instancenorm, templates/norm_stats.py): the stats pass's tiles
    and chunks, the combine launch's slots, the apply pass's tiles and order."""

    BR: int  # stats pass: tile rows (positions)
    BC: int  # stats pass: tile channels
    CHUNK: int  # stats pass: tiles a program reduces
    W: int  # stats pass: warps
    ABR: int  # apply pass: tile rows
    ABC: int  # apply pass: tile channels
    AW: int  # apply pass: warps
    BS: int  # combine: statistic slots a program
    CW: int  # combine: warps
    ST: int | None = None  # stats loop pipeline depth (0: a plain loop) (0)
    PF: int | None = None  # 1: register prefetch of the next tile instead (0)
    ORDER: int | None = None  # apply pass tile order: 0 memory order, 1/2 what the stats pass read last first (0)

    def __post_init__(self) -> None:
        _one_of("ORDER", self.ORDER, (0, 1, 2), "triton.norm_stats.knob", "use ORDER 0, 1 or 2")
