"""What a generated flash-attention kernel computes, as a small frozen description that the kernel
generators (forward.py, backward.py) turn into Triton source: problem sizes, how each tensor lies in
memory (strides baked into the code), the masks, bias, dropout, the scale, and hooks through which a
template emits fused pointwise code (score modifier, q/k/v prologue, O epilogue).

Tensors are logical [B, H, S, D] (stats [B, H, Sq, 1], bias [B, H, Sq, Skv], seq lens [B, 1, 1, 1]);
each is an `Operand`: the kernel parameter that points to its buffer, its element type and its
strides per logical axis (0 along a broadcast axis), the last one 1 for q/k/v/o and their gradients.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ....core.errors import AttributeValueError
from ..knobs import Knobs

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class Operand:
    """A tensor the kernel reads or writes: parameter `name`, element type `dtype` (a tl dtype
    string), `strides` per logical axis (elements; 0 = broadcast), `offset` elements into the buffer."""

    name: str
    dtype: str
    strides: tuple[int, ...]
    offset: int = 0


@dataclass(frozen=True)
class Scalar:
    """A run-time scalar: `kind` "arg" (a pass-by-value kernel argument: a float64 one, or with `dtype`
    tl.int64 an int64 one, a Philox seed or offset) or "ptr" (a 1-element device tensor read by the
    kernel, of tl dtype `dtype`), in parameter `name`."""

    kind: str
    name: str
    dtype: str = "tl.float32"


class Causal(enum.Enum):
    NONE = "none"
    TOP_LEFT = "top_left"  # key j is seen by query i when j <= i
    BOTTOM_RIGHT = "bottom_right"  # j <= i + (kv_len - q_len): the diagonal ends at the last key


@dataclass(frozen=True)
class Ragged:
    """How a packed (ragged, THD) tensor [1, H, T, w] holds its sequences: sequence b's row i is row
    floor(offsets[b] / per_row) + i of axis 2 (`offsets`: an integer [B(+1), 1, 1, 1] tensor;
    `per_row`: what one row counts in its units), `tokens` = T rows in all. Rows outside [0, T) read
    as zeros and are never written."""

    offsets: Operand
    per_row: int
    tokens: int


@dataclass(frozen=True)
class Paged:
    """A paged k or v: its operand is the container [pages, H, block, w]; key j of sequence b is row
    j % block of page table[b, j // block] (`table`: an integer [B, 1, slots, 1] tensor). A page index
    outside [0, pages) or a slot past the table reads zeros. With `rows` the table is packed: slot s of
    sequence b is row floor(offsets[b] / per_row) + s of it, a row outside [0, T) page 0 (the reference's
    unpacking), `slots` the pages of max_seq_len_kv."""

    table: Operand
    pages: int
    block: int
    slots: int
    rows: Ragged | None = None  # a packed table [1, 1, T, 1]: sequence b's slots from its offset on


@dataclass(frozen=True)
class PhiloxDropout:
    """Dropout drawn in the kernel: keep an element when its uniform draw (tl.rand) is >= p; kept
    elements are scaled by 1/(1-p). `seed` and `offset`: 1-element integer device tensors (Scalar
    "ptr"), pass-by-value int64 kernel arguments (Scalar "arg") or numbers baked in."""

    p: float
    seed: Scalar | int
    offset: Scalar | int


@dataclass(frozen=True)
class MaskDropout:
    """Dropout by an explicit mask tensor (broadcast to [B, H, Sq, Skv]) times `scale`."""

    mask: Operand
    scale: float | Scalar


@dataclass(frozen=True)
class Coords:
    """Expressions of a tile element's logical coordinates, for hooks: batch `b`, head `h` (of the
    tensor the hook works on), `i`/`j` (query/key position, or sequence/feature for q/k/v/O tiles),
    and `mask`, the tile's in-bounds predicate (None where every element is in bounds)."""

    b: str
    h: str
    i: str
    j: str
    mask: str | None = None

    def axis(self, n: int) -> str:
        return (self.b, self.h, self.i, self.j)[n]


class ScoreMod(Protocol):
    """Pointwise code on the score tile. `forward` returns (lines, the modified score's expression)
    given the name of the score tile (fp32, natural units: scale * q.k + bias + alibi); `backward`
    returns (lines, the gradient of the unmodified score's expression) given the score tile and the
    name of the gradient of the modified one (it may recompute what `forward` computed). Extra kernel
    parameters (tensors the code reads) are `params()`."""

    def params(self) -> tuple[str, ...]: ...

    def forward(self, score: str, at: Coords) -> tuple[list[str], str]: ...

    def backward(self, score: str, grad: str, at: Coords) -> tuple[list[str], str]: ...


class TileHook(Protocol):
    """Pointwise code making a q/k/v tile (prologue: `value` None; the hook reads what it needs and
    returns (lines, the tile's expression), nothing else loads the operand), or on the normalized O
    tile (epilogue: `value` is its fp32 expression; returns (lines, the value to store as O, or None
    where O is not stored)). `params()`: the kernel parameters the code reads."""

    def params(self) -> tuple[str, ...]: ...

    def emit(self, value: str | None, at: Coords) -> tuple[list[str], str | None]: ...


@dataclass(frozen=True)
class AttnSpec:
    """One attention problem. Forward reads q, k, v and writes o (and stats); backward reads q, k,
    v, o, do, stats and writes dq, dk, dv (and dbias)."""

    B: int
    Hq: int
    Hk: int
    Hv: int
    Sq: int
    Skv: int
    D: int
    Dv: int
    q: Operand
    k: Operand
    v: Operand
    o: Operand | None = None
    stats: Operand | None = None  # [B, Hq, Sq, 1] fp32, natural-log LSE
    scale: float | Scalar = 1.0
    causal: Causal = Causal.NONE
    window: int | None = None  # key j is seen by query i when i + diag - j < window
    seq_len_q: Operand | None = None  # [B, 1, 1, 1] int32
    seq_len_kv: Operand | None = None
    alibi: bool = False
    bias: Operand | None = None
    dropout: PhiloxDropout | MaskDropout | None = None
    score_mod: ScoreMod | None = field(default=None, compare=False)
    prologue: tuple[tuple[str, TileHook], ...] = field(default=(), compare=False)  # ("q"|"k"|"v", hook)
    epilogue: TileHook | None = field(default=None, compare=False)
    # backward
    do: Operand | None = None
    dq: Operand | None = None
    dk: Operand | None = None
    dv: Operand | None = None
    dbias: Operand | None = None  # shaped like bias, which may broadcast
    bias_dims: tuple[int, int, int, int] | None = None  # bias's logical dims (1 where broadcast)
    # the diagonal band beyond the causal flags: key j is seen when j <= i + diag + right;
    # diag = kv_len - q_len (per sequence) with bottom_right, else 0 (causal sets both itself)
    right: int | None = None
    bottom_right: bool = False
    # packed tensors: "q", "k", "v", "o", "stats" (forward); and "do", "dq", "dk", "dv" (backward)
    ragged: tuple[tuple[str, Ragged], ...] = ()
    paged: tuple[tuple[str, Paged], ...] = ()  # paged caches ("k", "v") (forward)
    # sinks and the softmax's statistics: one logit a query head ([1, Hq, 1, 1]) joining the softmax of
    # every row within its sequence; the forward's score_max / score_sum_exp ([B, Hq, Sq, 1] like
    # stats: the row max m and sum Z in natural units), the Stats of an empty row ("+inf" or "-inf"); the
    # backward's dSink ([1, Hq, 1, 1] fp32)
    sink: Operand | None = None
    score_max: Operand | None = None
    score_sum_exp: Operand | None = None
    empty_stats: str = "+inf"
    rng_dump: Operand | None = None  # the Philox dropout's keep mask [B, Hq, Sq, Skv] (1.0 / 0.0)
    # a block mask [B, Hq, ceil(Sq/128), ceil(ceil(Skv/128)/8)] bytes: score (i, j) kept where bit
    # (j // 128) % 8 of byte [b, h, i // 128, j // 1024] is set (every loop then masks)
    block_mask: Operand | None = None
    dsink: Operand | None = None
    # arithmetic
    interpret: bool = False  # Triton's interpreter: bf16 dots run in fp32 (its bf16 math is wrong)
    fp32_precision: str = "ieee"  # tl.dot input precision for fp32 operands: "ieee" or "tf32"
    # a dynamic plan's bucket kernel (sized.py): the size parameters its dynamic sizes (sized.Size) print
    # as; None where every size is an int
    sizes: Any = field(default=None, compare=False)

    @property
    def gk(self) -> int:
        return self.Hq // self.Hk

    @property
    def gv(self) -> int:
        return self.Hq // self.Hv

    @property
    def right_bound(self) -> int | None:
        """The band's right bound R (key j seen when j <= i + diag + R): 0 under a causal flag."""
        return 0 if self.causal is not Causal.NONE else self.right

    @property
    def diag_from_lengths(self) -> bool:
        """Whether the band's diagonal is bottom-right aligned (diag = kv_len - q_len)."""
        return self.causal is Causal.BOTTOM_RIGHT or self.bottom_right

    def packed(self, role: str) -> Ragged | None:
        return next((r for n, r in self.ragged if n == role), None)

    def page(self, role: str) -> Paged | None:
        return next((r for n, r in self.paged if n == role), None)

    @property
    def masked_rows_possible(self) -> bool:
        """Whether some row may see no key at all, or a score may be -inf (guards needed)."""
        return (
            self.causal is Causal.BOTTOM_RIGHT
            or self.seq_len_kv is not None
            or self.window is not None
            or self.right is not None
            or self.bottom_right
            or bool(self.ragged)
            or bool(self.paged)
            or self.bias is not None
            or self.score_mod is not None
            or self.block_mask is not None
            or self.Sq > self.Skv
        )

    def hook(self, role: str) -> TileHook | None:
        return next((h for r, h in self.prologue if r == role), None)


@dataclass(frozen=True)
class FwdKnobs(Knobs):
    """The forward kernel's knobs (the attention template's family, knobs.py)."""

    BLOCK_M: int = 128
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 3
    TMA: int = 0  # read q, k and v through device-side tensor descriptors (zero-filled edges, no masks)
    ORDER: int = 0  # 1: grid (batch x head, query block): all heads' heaviest blocks first
    ONELOOP: int = 0  # one loop over every visited key block, the masks applied under a run-time test
    fp32_precision: str | None = None  # fp32 operands: "tf32" products instead of IEEE fp32 (the spec's, "ieee")
    # split-KV (flash-decoding): SPLIT programs per query block, each over 1/SPLIT of the keys, writing
    # fp32 partials (m, l, unnormalised O) that a second launch combines; None: one program per block
    SPLIT: int | None = None
    # GQA head packing (decode): 1: one program per key/value head, its tile's rows the G = Hq / Hk query
    # heads of the group times the queries (row r: query r // G of head Hk-head * G + r % G), so each K/V
    # block is loaded once per key/value head instead of once per query head; None: a program per query head
    PACK_GQA: int | None = None
    # the tile list (packed queries): 1: the programs walk the sequences' own query blocks, the highest
    # block of every sequence first, instead of a grid over the longest sequence's blocks (tiles.py)
    TILES: int | None = None
    # 1: the key loop warp-specialised (Triton's tl.range(warp_specialize=True); on Hopper a producer warp
    # group issues the TMA loads while consumer groups compute): with TMA=1 and ONELOOP=1, where the loop
    # loads nothing but K and V (warpspec.py); its masks are applied at every step (a branch in the loop
    # keeps Triton from partitioning it)
    WS: int | None = None

    # (chosen by the build's policy: opgraph/build/split_kv.py, opgraph/build/gqa_pack.py)
    CHOICES: ClassVar[frozenset[str]] = frozenset({"SPLIT", "PACK_GQA"})
    UNMEASURED: ClassVar[frozenset[str]] = frozenset({"TILES", "WS"})

    def __post_init__(self) -> None:
        if self.PACK_GQA not in (None, 0, 1):
            raise AttributeValueError(
                f"PACK_GQA={self.PACK_GQA} must be 0 or 1",
                rule="triton.attention.knob",
                hint="use PACK_GQA=1 to pack a key/value head's query heads into one tile, or drop it",
            )
        _tiles_knob(self.TILES)
        others = self.SPLIT or self.PACK_GQA or self.TILES
        if self.WS not in (None, 0, 1) or (self.WS and (not (self.TMA and self.ONELOOP) or others)):
            raise AttributeValueError(
                f"WS={self.WS} (with TMA={self.TMA}, ONELOOP={self.ONELOOP}, SPLIT={self.SPLIT}, PACK_GQA="
                f"{self.PACK_GQA}, TILES={self.TILES}): WS is 0 or 1, and 1 needs TMA=1 and ONELOOP=1 and none "
                "of SPLIT, PACK_GQA, TILES",
                rule="triton.attention.knob",
                hint="use WS=1 with TMA=1 and ONELOOP=1 (take configs from engine_configs()), or drop it",
            )


def _tiles_knob(value: int | None) -> None:
    if value not in (None, 0, 1):
        raise AttributeValueError(
            f"TILES={value} must be 0 or 1",
            rule="triton.attention.knob",
            hint="use TILES=1 to walk packed sequences as a list of their own blocks, or drop it",
        )


@dataclass(frozen=True)
class BwdKnobs(Knobs):
    """The backward kernels' knobs (the attention_bwd template's family, knobs.py)."""

    BLOCK_M1: int = 64  # dk/dv kernel: query rows per step
    BLOCK_N1: int = 128  # dk/dv kernel: keys per program
    BLOCK_M2: int = 128  # dq kernel: queries per program
    BLOCK_N2: int = 64  # dq kernel: keys per step
    W1: int = 8
    S1: int = 2
    W2: int = 8
    S2: int = 2
    PRE_BLOCK: int = 64  # preprocess rows per program
    TMA: int = 0  # read the streamed tiles (q, dO in dK/dV; k, v in dQ) through tensor descriptors
    FUSED: int = 0  # one launch for dK/dV and dQ (W1, S1 for both), as FlexAttention
    ONELOOP: int = 0  # one loop over every visited block per kernel, the masks applied under a run-time test
    # the tile list (packed q, k, v and gradients): 1: the dK/dV and dQ programs walk the sequences' own
    # key and query blocks instead of grids over the longest sequence's (tiles.py)
    TILES: int | None = None

    UNMEASURED: ClassVar[frozenset[str]] = frozenset({"TILES"})
    fp32_precision: str | None = None  # as FwdKnobs'

    def __post_init__(self) -> None:
        _tiles_knob(self.TILES)
