"""matmul: C[b..., M, N] = A[b..., M, K] @ B[b..., K, N] with broadcast batch axes and any strides
(row-major, column-major, gapped, slices and transposes of tensors in memory read in place), and
the shared prologue / epilogue / reductions of gemm.py.

Each program computes one BLOCK_M x BLOCK_N tile of one batch entry (the batch index is folded into
the grid, group-M swizzled tiles inside it) over K in BLOCK_K steps; a broadcast batch axis of an
operand (dim 1) simply drops out of its addressing. A row reduction of the result (e.g. a sum over
N) is a "cols" reduction of the tile; with N <= BLOCK_N one program holds whole rows and writes the
results itself.

Knob TMA=1 reads each operand that allows it (no prologue, one contiguous axis among its last two,
16-byte aligned strides, at most one batch axis) through a device-side tensor descriptor: TMA
copies, zero-filled at the edges, no masks. PERSISTENT=P runs P programs that loop over the tiles
(the descriptors are built once per program). TMA_HOST=1 passes the descriptors as kernel arguments
instead, encoded when the kernel is bound: the Hopper path (_matmul_hopper.py), which the candidates
offer first on compute capability 9.0+ with FLATTEN=1 and the epilogue on column halves.

A piece of a dynamic plan's bucket (sizes.py) whose dynamic sizes are M, N or batch dims (K static)
gets a kernel that takes them at run time (`MatmulMatch.bucket`):
M, the batch dims, the tile counts and the strides they set are size arguments, the grid is evaluated
per shape (a persistent grid is PERSISTENT programs at every shape), so every shape of the bucket
runs one source and one binary. TMA_HOST configs (the Hopper path, first on Hopper) are bucket kernels
too: a host descriptor's shape and strides are expressions of the dynamic dims (`Arg.desc_expr`),
evaluated per shape and encoded at bind, and an operand is read through one where `tma_ok` holds at
every shape of the bucket (a dynamic axis counted as more than 1, its stride 16-byte aligned by its
known divisor). SPLIT_K > 1 is in the bucket's kernels too: the slices' fp32 partials laid out for the
bucket's largest shape (at most SPLIT_PARTIALS_BYTES, else generated at each shape), indexed by the
run-time M, and the launch that sums them (on its tiles chosen at the bucket's smallest shape) takes the
sizes. Configs whose structure depends on the shape are generated at each shape with the bucket's knobs,
as before: TMA=1 without TMA_HOST (device-side descriptors), and reductions in the epilogue whose slots
span a dynamic size (a column reduction over a dynamic M, a mean over a dynamic count). A row reduction
is in the bucket's kernel:
one program a row (N <= BLOCK_N), or partials per column tile (RMSNorm's mean of squares after a
Llama block's output projection, N > BLOCK_N) laid out for the bucket's largest M (`Context.largest`,
`Generated.bucket_scratch`) and a combine launch taking the run-time sizes.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from ....core.config import Support
from ....core.errors import AttributeValueError
from ....core.ir import Node, ShapeOrigin
from ....core.piece import Piece
from ....core.symbolic import Expr, bounds, evaluate, log_point
from ....core.tensor import TensorDesc
from ...shared.symbolic import symbolic_piece
from ..expr import TL_DTYPE
from ..gemm import (
    FP8_TYPES,
    Context,
    GemmPiece,
    MainLoop,
    OutputSpace,
    Signature,
    TileIndexer,
    TileLoop,
    TileMatch,
    TileTemplate,
    estimate_us,
    finish_candidates,
    fp8_join_cost,
    fp32_knobs,
    gemm_candidates,
    operand_bytes,
    operand_tile,
    sibling_acc,
    tma_ok,
    tma_prelude,
)
from ..knobs import TileKnobs
from ..sizes import Sizes, above_one, bucket_analysis
from ._matmul_fold import fold_rows
from ._matmul_hopper import (
    HopperLoop,
    hopper_config,
    host_descriptors,
    host_tma_ok,
    math_heavy_epilogue,
    occupancy_config,
)
from ._matmul_regroup import regroup_rows
from ._matmul_split_cols import split_columns
from ._matmul_ws import WS_TILE, WarpSpecLoop, ws_config, ws_rank, ws_refusal
from .base import Generated

# per operand: (the tile's row index start, its column index start) in the main loop
_STARTS = {"A": ("pid_m * BLOCK_M", "it * BLOCK_K"), "B": ("it * BLOCK_K", "pid_n * BLOCK_N")}
_BLOCKS = {"A": ("BLOCK_M", "BLOCK_K"), "B": ("BLOCK_K", "BLOCK_N")}


# (MatmulMatch._bucket_structure, knobs) -> whether that split-K config's kernels serve the whole bucket:
# generating them to find out is most of a bucket's planning, and the layers of a model ask the same
_ONE_KERNEL: dict[tuple[object, ...], bool] = {}
_ONE_KERNEL_SIZE = 4096
_ONE_KERNEL_LOCK = threading.Lock()


@dataclass(frozen=True)
class Descriptor:
    """How an operand is read through a tensor descriptor: from buffer `base` at `offset`, with its
    batch axis (or None), transposed when its rows (not its columns) are contiguous."""

    base: int
    offset: int
    desc: TensorDesc
    batch: int | None
    transposed: bool


def _kind(role: str) -> str:
    """The operand a role names: "A", "B", or a sibling's B ("B_s0": GemmPiece.siblings) read as B is."""
    return role.split("_")[0]


def operand_roles(gp: GemmPiece) -> dict[str, Node]:
    """Every operand the main loop loads, by role, with the product reading it: A and B of the main op,
    then B_s0, B_s1, ... of its siblings."""
    roles = {"A": gp.main, "B": gp.main}
    roles.update({f"B_s{i}": node for i, node in enumerate(gp.siblings)})
    return roles


def descriptor(gp: GemmPiece, role: str, node: Node | None = None) -> Descriptor | None:
    uid = (node or gp.main).input(_kind(role))
    assert isinstance(uid, int)
    if gp.prologue.get(uid):
        return None
    desc = gp.tensor(uid)
    view = gp.views.get(uid)
    base, offset = (view.base, view.offset) if view is not None else (uid, 0)
    rank = len(desc.dim)
    batch = [a for a in range(rank - 2) if above_one(desc.dim[a])]
    if len(batch) > 1:
        return None
    for inner, transposed in ((rank - 1, False), (rank - 2, True)):
        if tma_ok(desc, offset, inner):
            return Descriptor(base, offset, desc, batch[0] if batch else None, transposed)
    return None


def _epilogue_width(k: TileKnobs) -> int:
    """The columns of each product in one pass of a config's epilogue (a half tile with EPILOGUE_SUBTILE=2)."""
    assert k.BLOCK_N is not None
    return k.BLOCK_N // 2 if k.subtile == 2 and k.BLOCK_N >= 32 else k.BLOCK_N


def _whole_heads(configs: list[TileKnobs], head: int) -> list[TileKnobs]:
    """The configs with tiles of whole heads where the epilogue swaps their halves (GemmPiece.swapped_heads):
    BLOCK_N raised to a head, EPILOGUE_SUBTILE dropped where its halves would cut one, unsplit (split-K's
    epilogue launch tiles the columns its own way)."""
    fitted = []
    for c in configs:
        assert c.BLOCK_N is not None
        c = c.replace(BLOCK_N=max(c.BLOCK_N, head), SPLIT_K=1, EPI_M=None, EPI_N=None)
        fitted.append(c if _epilogue_width(c) % head == 0 else c.replace(EPILOGUE_SUBTILE=None))
    return list(dict.fromkeys(fitted))


def _share(block_n: int, width: int) -> int:
    """Each of `width` products' columns in a tile of `block_n` (a power of two, 16 at least)."""
    return max(16, 1 << (max(block_n // width, 1).bit_length() - 1))


class MatmulTemplate(TileTemplate):
    name = "matmul"
    priority = 50
    main_kinds = ("matmul",)
    main_label = "matmul"
    dot_roles = ("A", "B")
    sibling_mains = True
    whole_reductions = True

    def sized_knobs(self, knobs: TileKnobs) -> bool:
        """Whether a config's kernel can take a dynamic plan's sizes at run time (MatmulMatch.kernels):
        not device-side TMA (the attention templates answer the same question), not the Gluon kernel (WS=1,
        made per shape); split-K only where its partials fit (MatmulMatch.one_kernel)."""
        return (not knobs.tma or knobs.tma_host) and not knobs.ws

    def analyze(self, piece: Piece) -> tuple[GemmPiece | None, Support]:
        """The piece's analysis, over its tensors with B's broadcast batch axes folded into the rows where
        that changes the tiling (_matmul_fold.py), or its epilogue's reshapes of the rows made identities
        (_matmul_regroup.py); the piece as it is where the folded one is not a GEMM piece (A's views, folded,
        not read in place). A piece whose epilogue splits the product's columns into heads is analysed over
        the split space (_matmul_split_cols.py)."""
        split = split_columns(piece)
        if split is not None:  # (its verdict, where it is no GEMM piece, says why better than the piece's)
            return super().analyze(split)
        folded = fold_rows(piece) or regroup_rows(piece)
        if folded is not None:
            gp, verdict = super().analyze(folded)
            if gp is not None:
                return gp, verdict
        return super().analyze(piece)

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        c = piece.tensor(main.output_uids()[0])
        rank = len(c.dim)
        a = main.input("A")
        assert isinstance(a, int)
        if rank > len(piece.tensor(a).dim):  # (its columns split into heads: _matmul_split_cols.py)
            return OutputSpace(c.dim, rows=tuple(range(rank - 2)), col=rank - 2, cols=(rank - 1,))
        return OutputSpace(c.dim, rows=(rank - 2,), col=rank - 1, batch=tuple(range(rank - 2)))


BUCKET_SAMPLES = 5  # shapes across a dynamic plan's bucket at which its GEMM tiles are weighed (MatmulMatch._weighed)
# The most bytes a bucket kernel's split-K partials may take: they are laid out for the bucket's largest
# shape, where a split rarely pays (the Llama's down projection split 4-8 at the bucket of up to 4,096 rows:
# 64-128 MiB, in the one scratch region the plan's steps share), so larger ones are generated at each shape.
SPLIT_PARTIALS_BYTES = 128 << 20


class BucketSample(NamedTuple):
    """A bucket's product at one of its shapes (MatmulMatch.bucket_samples)."""

    m: int
    n: int
    nbatch: int
    moved_bytes: int


class MatmulMatch(TileMatch):
    template: MatmulTemplate
    own_knobs = frozenset({"WS"})
    focus: BucketSample | None = None  # (`focused`: the shape of its bucket the match ranks at)

    @cached_property
    def problem(self) -> tuple[int, int, int, int]:
        """(M, N, K, bytes an operand element) of the product (of each product, with siblings)."""
        a, b = self.gp.operand("A"), self.gp.operand("B")
        elem = operand_bytes(a.data_type, b.data_type, native_fp8=self.native_fp8)
        return self.gp.space.m, self.gp.space.n, a.dim[-1], elem

    @cached_property
    def native_fp8(self) -> bool:
        """Whether the operands are fp8 and multiply on the fp8 tensor cores: every operand tile loaded as it
        is in memory (no prologue: a computed fp8 operand is widened) on a GPU that has them (sm_89 and up), not
        under the interpreter."""
        capability = self.device.capability
        if not self.device.is_cuda or self.interpret or capability is None or capability < (8, 9):
            return False
        uids = [node.input(_kind(role)) for role, node in operand_roles(self.gp).items()]
        ints = [u for u in uids if isinstance(u, int)]
        return all(self.gp.tensor(u).data_type in FP8_TYPES and not self.gp.prologue.get(u) for u in ints)

    @cached_property
    def descriptors(self) -> dict[str, Descriptor]:
        """The operands a tensor descriptor can read (TMA=1 configs read them so)."""
        found = {role: descriptor(self.gp, role, node) for role, node in operand_roles(self.gp).items()}
        return {role: d for role, d in found.items() if d is not None}

    def validate(self, k: TileKnobs) -> None:
        head = self.gp.swapped_heads
        if head is not None and k.split_k > 1:
            raise AttributeValueError(
                f"SPLIT_K={k.split_k}: the epilogue swaps the halves of heads of {head} columns in registers, which "
                "the split-K epilogue launch's own tiles do not keep whole",
                op=self.gp.main.label(),
                rule="triton.gemm.knob",
                hint="drop SPLIT_K from this config",
            )
        if head is not None and _epilogue_width(k) % head:
            raise AttributeValueError(
                f"BLOCK_N={k.BLOCK_N}{' with EPILOGUE_SUBTILE=2' if k.subtile == 2 else ''}: the epilogue swaps the "
                f"halves of heads of {head} columns in registers, so each (sub)tile holds whole heads",
                op=self.gp.main.label(),
                rule="triton.gemm.knob",
                hint=f"pick BLOCK_N a multiple of {head} (of {2 * head} with EPILOGUE_SUBTILE=2)",
            )
        if self.gp.siblings and k.split_k > 1:
            raise AttributeValueError(
                f"SPLIT_K={k.split_k}: {self.gp.main.label()} and the products beside it "
                f"({', '.join(n.label() for n in self.gp.siblings)}) are computed unsplit",
                op=self.gp.main.label(),
                rule="triton.gemm.knob",
                hint="drop SPLIT_K from this config",
            )

    def iterations(self, k: TileKnobs) -> int:
        assert k.BLOCK_K is not None
        return -(-self.problem[2] // k.BLOCK_K)

    @cached_property
    def bucket(self) -> tuple[GemmPiece, ShapeOrigin] | None:
        """The analysis of the piece's symbolic origin (sizes.symbolic_piece), whose kernels take the
        dynamic sizes at run time (the module docstring says which), and the origin, where the piece is
        of a dynamic plan's bucket and has a dynamic size and its K is static; else None."""
        found = bucket_analysis(self.piece, lambda p: self.template.analyze(p)[0], dynamic_io=True)
        if found is None or found[1] is None or isinstance(found[1].operand("A").dim[-1], Expr):
            return None
        return found[1], found[2]

    def one_kernel(self, k: TileKnobs) -> bool:
        """Whether config `k` has one kernel for every shape of the piece's bucket (`kernels`): not
        device-side TMA; split-K only where its partials at the bucket's largest shape are within
        SPLIT_PARTIALS_BYTES and its kernels are generated for the bucket (a reduction in the epilogue
        over a dynamic M is generated at each shape: the bucket would re-choose a split variant there)."""
        if self.bucket is None or not self.template.sized_knobs(k):
            return False
        if k.split_k == 1:
            return True
        key = (self._bucket_structure, k)
        found = _ONE_KERNEL.get(key)
        if found is None:
            found = self._bucket_kernels(k) is not None
            with _ONE_KERNEL_LOCK:  # (builds in several threads share it)
                _ONE_KERNEL[key] = found
                while len(_ONE_KERNEL) > _ONE_KERNEL_SIZE:
                    _ONE_KERNEL.pop(next(iter(_ONE_KERNEL)))
        return found

    @cached_property
    def _bucket_structure(self) -> tuple[object, ...]:
        """What a bucket's split-K kernels of this piece depend on, but for the knobs: the symbolic piece's
        structure (Piece.signature: no UIDs or names, so a model's layers share it), the bucket's ranges,
        the device and the template."""
        assert self.bucket is not None
        symbolic = symbolic_piece(self.piece)
        signature = symbolic.signature() if symbolic is not None else object()  # (then shared with none)
        return (signature, self.bucket[1].bucket.ranges, self.device, self.template.name)

    def _bucket_kernels(self, k: TileKnobs) -> Generated | None:
        """The bucket's kernels of config `k` (taking their sizes at run time), None where the piece or the
        config does not allow them; memoized per config (the piece's focused copies share the memo)."""
        memo = self.__dict__.setdefault("_bucket_memo", {})
        if k in memo:
            return memo[k]
        found = None
        gp, origin = self.bucket or (None, None)
        if gp is not None and origin is not None and self.template.sized_knobs(k) and self._partials_fit(k):
            bucket = MatmulMatch(self.template, gp, self.device)
            bucket.sizes = Sizes(origin)  # (its own: the parameters named in the order this kernel uses them)
            try:
                generated = bucket.kernels(k)
            except TypeError:  # a decision on a dynamic size (an epilogue op's, partials'): at the shape
                pass
            else:
                found = generated if generated.sized else None
        memo[k] = found  # (one assignment: a thread reading the memo meanwhile computes it too)
        return found

    def _partials_fit(self, k: TileKnobs) -> bool:
        """Whether split-K's partials at the bucket's largest shape are within SPLIT_PARTIALS_BYTES."""
        if k.split_k == 1:
            return True
        assert self.bucket is not None
        gp, origin = self.bucket
        return bounds(gp.space.partials(k.split_k) * 4, origin.bucket.range_map)[1] <= SPLIT_PARTIALS_BYTES

    def kernels(self, k: TileKnobs) -> Generated:
        """The bucket's kernels (taking their sizes at run time) where the piece and the config allow
        (`_bucket_kernels`), else the kernels at the piece's shape."""
        generated = self._bucket_kernels(k)
        return generated if generated is not None else super().kernels(k)

    def _cost(self, c: TileKnobs, moved_bytes: int | None = None, sample: BucketSample | None = None) -> float:
        """The cost model's µs: products beside the main op (siblings) as one product of their columns
        side by side, each program's tile BLOCK_N wide in each; at another shape of the piece's bucket
        where `sample` says which (bucket_samples), else at the piece's own."""
        m, n, k, elem = self.problem
        sample = sample or self.focus
        m, n, nbatch = (sample.m, sample.n, sample.nbatch) if sample else (m, n, self.gp.space.nbatch)
        if moved_bytes is None:
            moved_bytes = sample.moved_bytes if sample else self.gp.moved_bytes()
        width = len(self.gp.mains)
        return estimate_us(
            m,
            n * width,
            k,
            c.replace(BLOCK_N=c.BLOCK_N * width) if width > 1 else c,
            nprog=nbatch,
            device=self.device,
            elem_bytes=elem,
            moved_bytes=moved_bytes,
            latency_floor=True,
        )

    @cached_property
    def bucket_samples(self) -> tuple[BucketSample, ...]:
        """The product at BUCKET_SAMPLES shapes across the piece's bucket, from its smallest to its largest
        (each dynamic dim at one log-spaced point of its range): M, N, batch programs and the bytes the
        piece moves there (its tensors' extents at that shape: a weight's stay, the activations' grow);
        () off a bucket."""
        if self.bucket is None:
            return ()
        ranges = self.bucket[1].bucket.range_map
        return tuple(self.sample_at(log_point(ranges, i / (BUCKET_SAMPLES - 1))) for i in range(BUCKET_SAMPLES))

    def sample_at(self, env: Mapping[str, int]) -> BucketSample:
        """The bucket's product at its shape `env` (the dynamic dims' values; `bucket` is not None)."""
        m, n, nbatch, moved = self._bucket_exprs
        return BucketSample(evaluate(m, env), evaluate(n, env), evaluate(nbatch, env), evaluate(moved, env))

    @cached_property
    def _bucket_exprs(self) -> tuple[Expr | int, Expr | int, Expr | int, Expr | int]:
        """M, N, batch programs and moved bytes of the bucket's product: expressions of the dynamic dims."""
        assert self.bucket is not None
        gp = self.bucket[0]
        return gp.space.m, gp.space.n, gp.space.nbatch, gp.moved_bytes()

    def estimate_at(self, knobs: TileKnobs, env: Mapping[str, int]) -> float | None:
        """`_cost` at the bucket's shape `env` (the plain kernel's model: `strategy` is the match itself)."""
        if self.bucket is None or not self.device.is_cuda:
            return None
        return self._cost(knobs, sample=self.sample_at(env)) * self._fp8_join(knobs)

    def focused(self, env: Mapping[str, int]) -> MatmulMatch | None:
        """This bucket piece's match with its candidates and estimates at one shape `env` of its bucket, and
        only the configs whose one kernel serves the whole bucket (`one_kernel`): a bucket's tile variants
        (build/tile_variants.py). None off a bucket."""
        if self.bucket is None:
            return None
        sample = self.sample_at(env)
        self.__dict__.setdefault("_bucket_memo", {})  # (shared with the copy: kernels generated once)
        focused = copy.copy(self)
        focused.__dict__.pop("_candidates_memo", None)  # (its own, ranked at `env`)
        focused.__dict__.update(focus=sample, bucket_samples=(sample,), problem=(sample.m, sample.n, *self.problem[2:]))
        return focused

    def _weighed(self, c: TileKnobs) -> float:
        """A config's estimate where the build ranks it: at the piece's shape, or for a bucket's piece (one
        kernel serves every shape of the bucket) summed over shapes across the bucket: its time is mostly
        its large shapes', and a tile chosen at the hint alone follows the hint's wave count (the Llama's
        projections at 6 x 720 tokens chose 128 x 128 tiles, 1.1x slower from 9,000 tokens up)."""
        if not self.bucket_samples:
            return self._cost(c)
        return sum(self._cost(c, sample=sample) for sample in self.bucket_samples)

    def candidates(self) -> list[TileKnobs]:
        """The ranked configs (`_candidates`), made once per match: the planner asks a piece's match
        for them several times (its configs, the sibling merge, tile variants, `accepts`)."""
        found = self.__dict__.get("_candidates_memo")
        if found is None:
            found = self.__dict__["_candidates_memo"] = tuple(self._candidates())
        return list(found)

    def _candidates(self) -> list[TileKnobs]:
        gp, device = self.gp, self.device
        m, n, k, elem = self.problem
        a, b = gp.operand("A"), gp.operand("B")
        extra = fp32_knobs(a.data_type, b.data_type)
        width = len(gp.mains)
        configs = gemm_candidates(
            m,
            n * width,
            k,
            nprog=gp.space.nbatch if self.focus is None else self.focus.nbatch,
            device=device,
            elem_bytes=elem,
            moved_bytes=gp.moved_bytes() if self.focus is None else self.focus.moved_bytes,
            extra=extra,
            latency_floor=True,
        )
        if self.bucket_samples:  # (a bucket's tiles are weighed across it: its largest shape's offered too)
            big = self.bucket_samples[-1]
            at_big = gemm_candidates(
                big.m,
                big.n * width,
                k,
                nprog=big.nbatch,
                device=device,
                elem_bytes=elem,
                moved_bytes=big.moved_bytes,
                extra=extra,
                latency_floor=True,
            )
            configs = list(dict.fromkeys([*configs[:-1], *at_big[:-1]])) + configs[-1:]
        if width > 1:  # (the tiles of the products side by side: each about BLOCK_N / width wide, unsplit)
            configs = list(dict.fromkeys(c.replace(BLOCK_N=_share(c.BLOCK_N, width), SPLIT_K=1) for c in configs))
        if self.bucket is not None:
            unsplit = [c.replace(SPLIT_K=1) for c in configs[:-1] if c.SPLIT_K != 1]
            configs = list(dict.fromkeys([*configs[:-1], *unsplit])) + configs[-1:]
        if device.is_cuda and len(self.descriptors) == len(operand_roles(gp)):
            # TMA (+ persistent) versions of the plain configs, and on Hopper the host-descriptor path
            # (_matmul_hopper.py), ranked together by the cost model
            host_ok = host_tma_ok(self, device)
            tma, host = [], []
            for c in configs[:-1]:
                if c.SPLIT_K == 1:
                    tma.append(c.replace(TMA=1, PERSISTENT=device.sm_count))
                    tma.append(c.replace(TMA=1))
                    if host_ok:
                        host.append(hopper_config(c, device))
            configs = self._ranked(tma + configs[:-1] + host, 8) + configs[-1:]
            if host and elem == 2 and width == 1 and math_heavy_epilogue(gp):
                configs.insert(len(configs) - 1, occupancy_config(host[0], device))  # (for tuning to weigh)
            first = next((c for c in configs if c.persistent and not c.tma_host), None)
            if first is not None:  # its tile and K loops pipelined as one (FLATTEN), for tuning to weigh
                configs.insert(configs.index(first) + 1, first.replace(FLATTEN=1))
        elif self.bucket is not None:
            rest = configs[:-1]
            configs = (
                self._ranked(rest, len(rest)) if device.is_cuda else sorted(rest, key=self._per_shape)
            ) + configs[-1:]
        if width > 1:  # Triton's flattened loop pipelines two products' dots badly (a fifth slower at Llama's
            # SwiGLU: bench/results/triton-preferences.md#sibling-products)
            configs = list(dict.fromkeys(c.replace(FLATTEN=None) for c in configs))
        if self.focus is not None:
            configs = [c for c in configs[:-1] if self.one_kernel(c)] + configs[-1:]
        if gp.swapped_heads is not None:  # (before the stages are fitted to shared memory, and after the subtiles)
            configs = _whole_heads(configs, gp.swapped_heads)
        configs = finish_candidates(configs, gp, device, extra)
        if gp.swapped_heads is not None:
            configs = _whole_heads(configs, gp.swapped_heads)
        if self.native_fp8:
            return self._fp8_accumulation(configs)
        return self._warp_specialized(configs)

    def _warp_specialized(self, configs: list[TileKnobs]) -> list[TileKnobs]:
        """The configs with the warp-specialized Gluon kernel (WS=1, _matmul_ws.py) where the piece allows it
        and its tiles (WS_TILE) fill the GPU once at least, at its rank (`ws_rank`)."""
        m, n, _, _ = self.problem
        bm, bn, _ = WS_TILE
        host = next((c for c in configs if c.tma_host), None)
        if host is None or -(-m // bm) * -(-n // bn) < self.device.sm_count:
            return configs
        at = ws_rank(self)
        if at is None or ws_refusal(self) is not None:
            return configs
        ws = ws_config(self, host, self.device)
        return list(dict.fromkeys([*configs[:at], ws, *configs[at:]]))

    def _fp8_accumulation(self, configs: list[TileKnobs]) -> list[TileKnobs]:
        """An fp8 product's configs: the fp32 accumulator joined once a main-loop step (FP8_ACC's default,
        what cuBLAS's fp8 GEMM does unless asked for fast accumulation), in tiles at most 128 columns wide
        (a 64 x 256 warpgroup tile holds its fp32 sum beside the tensor cores': FP8_JOIN_COST), then the
        first config with fast accumulation (FP8_ACC=0, its numerical note), for tuning to weigh
        (bench/results/constants.md#fp8-accumulation)."""
        ranked, fallback = configs[:-1], configs[-1]
        if not ranked:
            return configs
        narrow = [c for c in ranked if c.BLOCK_N <= 128] or ranked
        fast = ranked[0].replace(FP8_ACC=0)
        return list(dict.fromkeys([narrow[0], fast, *narrow[1:], fallback]))

    def _per_shape(self, c: TileKnobs) -> bool:
        # A bucket's piece ranks the configs of one kernel for the whole bucket first (unsplit versions of
        # the split ones offered too). The others (device-side TMA, split-K whose partials outgrow the cap or
        # whose epilogue is made per shape: `one_kernel`) are generated and compiled again at every new shape,
        # and the estimate ranking them is the hint's: an fp32 GEMM of M 48 (the hint of M 1..4096) chose
        # split-K 4, then run at M 4096 too.
        return self.bucket is not None and not self.one_kernel(c)

    def _rank(self, c: TileKnobs) -> tuple[float, float]:
        """The estimate (`_weighed`); where the bytes bound every config (a tie), the config of the most
        math headroom (host descriptors, persistent, large tiles), which streams the bytes fastest
        (bench/results/constants.md#memory-bound-gemm-ties)."""
        return self._weighed(c), self._cost(c, moved_bytes=1)

    def _ranked(self, configs: list[TileKnobs], count: int) -> list[TileKnobs]:
        """The first `count` of `configs` by `_rank`, a bucket's per-shape kernels after all the others
        (`_per_shape`). That is asked of each config only down the ranking until `count` others are found:
        for a split-K config it generates the bucket's kernels, most of a bucket's planning time."""
        ranked = sorted(configs, key=self._rank)
        if self.bucket is None:
            return ranked[:count]
        kept: list[TileKnobs] = []
        per_shape: list[TileKnobs] = []
        for c in ranked:
            if len(kept) == count:
                break
            (per_shape if self._per_shape(c) else kept).append(c)
        return (kept + per_shape)[:count]

    def accepts(self, knobs: TileKnobs) -> bool:
        """A candidate, or one with another output tile (chosen at another M or N of the bucket: any
        tile runs the product, masked), whose structural choices (K step, split, TMA, persistence)
        this piece offers too."""
        tile = {"BLOCK_M": knobs.BLOCK_M, "BLOCK_N": knobs.BLOCK_N, "GROUP_M": knobs.GROUP_M}
        tile |= {"num_warps": knobs.num_warps, "num_stages": knobs.num_stages}
        tile |= {"EPI_M": knobs.EPI_M, "EPI_N": knobs.EPI_N}
        return any(c.replace(**tile) == knobs for c in self.candidates())

    def cost(self, k: TileKnobs) -> float | None:
        """The estimate of a config; an fp8 product's with its fp32 joins priced (`fp8_join_cost`: the ranking
        leaves them out, every config of the same width paying the same, `_fp8_accumulation` choosing the width)."""
        if not self.device.is_cuda:
            return None
        return self._cost(k) * self._fp8_join(k)

    def _fp8_join(self, k: TileKnobs) -> float:
        return fp8_join_cost(k) if self.native_fp8 else 1.0

    def _descriptors(self, k: TileKnobs) -> dict[str, Descriptor]:
        return self.descriptors if k.tma else {}

    def prelude(self, ctx: Context, k: TileKnobs) -> list[str]:
        return tma_prelude(ctx.interpret) if self._descriptors(k) and not k.tma_host else []

    def loop(self, k: TileKnobs) -> TileLoop:
        if k.ws:
            return WarpSpecLoop(self)
        return HopperLoop(self) if k.tma_host else self

    def geometry(self, role: str, d: Descriptor) -> tuple[list[int], list[int], list[str]]:
        """The descriptor of operand `role`: its dims and strides (elements), outermost first, and its block
        (constexpr names, "1" for the batch axis)."""
        rank = len(d.desc.dim)
        axes = [rank - 1, rank - 2] if d.transposed else [rank - 2, rank - 1]
        blocks = list(reversed(_BLOCKS[_kind(role)])) if d.transposed else list(_BLOCKS[_kind(role)])
        shape = [d.desc.dim[a] for a in axes]
        strides = [d.desc.stride[a] for a in axes]
        if d.batch is not None:
            shape.insert(0, d.desc.dim[d.batch])
            strides.insert(0, d.desc.stride[d.batch])
            blocks.insert(0, "1")
        return shape, strides, blocks

    def setup(self, ctx: Context, sig: Signature, k: TileKnobs) -> list[str]:
        if k.tma_host:  # kernel arguments: nothing to make in the kernel
            host_descriptors(self, sig, k)
            return []
        lines = []
        for role, d in self._descriptors(k).items():
            shape, strides, blocks = self.geometry(role, d)
            base = sig.buf(d.base)
            if d.offset:
                base = f"{base} + {d.offset}"
            lines.append(
                f"desc_{role} = tl.make_tensor_descriptor({base}, shape={shape}, strides={strides}, "
                f"block_shape=[{', '.join(blocks)}])"
            )
        return lines

    def _tma_tile(self, ctx: Context, role: str, d: Descriptor, name: str) -> list[str]:
        rows, cols = _STARTS[_kind(role)]
        brows, bcols = _BLOCKS[_kind(role)]
        coords = [cols, rows] if d.transposed else [rows, cols]
        tile = (bcols, brows) if d.transposed else (brows, bcols)
        if d.batch is not None:
            coords.insert(0, f"y{d.batch}")
        expr = f"desc_{role}.load([{', '.join(coords)}])"
        if d.batch is not None:
            expr += f".reshape({tile[0]}, {tile[1]})"
        if d.transposed:
            expr += ".T"
        target = ctx.dot.target(d.desc.data_type) if ctx.dot is not None else ctx.compute
        if TL_DTYPE[d.desc.data_type] != target:
            expr += f".to({target})"
        return [f"{name} = {expr}"]

    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        gp = ctx.gp
        descs = self._descriptors(k)
        assert ctx.dot is not None and k.BLOCK_K is not None
        kdim = self.problem[2]
        bk = k.BLOCK_K
        batch = [("s", f"y{a}") for a in gp.space.batch]
        kmask = "kmask" if kdim % bk else None
        ptr = ctx.ptr_of(sig)
        text = ctx.tiling.text
        a_idx = TileIndexer(
            [*batch, ("r", "rm"), ("c", "rk")],
            ctx.tiling.rmask,
            kmask,
            ptr,
            ("BLOCK_M", "BLOCK_K"),
            zero=("rm", "rk"),
            text=text,
        )
        b_idx = TileIndexer(
            [*batch, ("r", "rk"), ("c", "rn")],
            kmask,
            ctx.tiling.cmask,
            ptr,
            ("BLOCK_K", "BLOCK_N"),
            zero=("rk", "rn"),
            text=text,
        )
        body = ["rk = it * BLOCK_K + tl.arange(0, BLOCK_K)"]
        if kmask:
            body.append(f"kmask = rk < {kdim}")
        accs = ["acc", *(sibling_acc("acc", i) for i in range(len(gp.siblings)))]
        for i, (role, node) in enumerate(operand_roles(gp).items()):
            name = "a" if role == "A" else f"b{role[1:]}"
            if role in descs:
                body += self._tma_tile(ctx, role, descs[role], name)
            else:
                body += operand_tile(ctx, sig, _kind(role), a_idx if role == "A" else b_idx, name, node=node)
            if i:
                body.append(f"{accs[i - 1]} = {ctx.dot.call('a', name, accs[i - 1])}")
        lines = [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), {ctx.dot.acc})" for acc in accs]
        lines.append(f"for it in range({lo}, {hi}):")
        return MainLoop(lines + ["    " + line for line in body])


MatmulTemplate.match_class = MatmulMatch
TEMPLATE = MatmulTemplate()
