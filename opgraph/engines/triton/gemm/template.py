"""The GEMM-class template protocol: `TileTemplate` recognises a piece (`analyze`), `TileMatch` holds the
analysis and generates every kernel of the family through one path (`TileMatch.build`) with named hooks.

What the shared path does with a config, and the hook of each step (a template overrides the hooks it
needs, in its match class; what varies by knobs is a strategy object the match returns):

    check()                    the verdict on the device (operand types tl.dot multiplies, declines)
    strategy(knobs)            the config's way of running (`Strategy`: its cost and kernels): the match
                               itself (the plain kernel), or a composite (conv's image prologue as its own
                               pass first: templates/_prologue_pass.py)
    validate(knobs)            typed errors for knobs the template refuses whatever its loop
    loop(knobs) -> TileLoop    the main loop: trip count, lines, accumulators, knob checks; conv_fprop and
                               conv_wgrad's merged-tap loops, the depthwise stencils and dgrad's stride
                               phases are loops (the depthwise row strips make their whole kernel body:
                               `KernelParts`)
    tiling(knobs)              the grid (Tiling and its subclasses, whose header is made of named parts)
    dot(knobs)                 how the main loop multiplies (tl.dot kind, or the stencils' fp32 FMA)
    prelude / setup            module-level source; per-program lines before any tile (TMA descriptors)
    loop.body                  the kernel's body: the tile header, the split-K range, the main loop, then
                               the epilogue, or partials (split-K, loops that always write partials)
    epilogue_launch            split-K: the launch that sums the partials on its own tiles and runs the
                               epilogue (conv_wgrad's sums blocks of slices: `BlockedCombine`)
    constexprs / meta          the kernels' compile-time values
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.ir import Node
from ....core.piece import Piece
from ....core.symbolic import Expr, SymInt, evaluate, known_divisor
from ..knobs import TileKnobs
from ..sizes import Sizes
from ..templates.base import INT32_LIMIT, Generated, Launch, Match, Template, module_source
from .analysis import GemmPiece, analyze
from .dots import DotKind, dot_kind
from .epilogue import Context, ReductionPlan, add_combines, epilogue, make_context, needs_int64
from .scratch import Scratch, Signature
from .space import OutputSpace
from .splitk import epilogue_tiling, slice_block, split_range, split_store, split_sum, split_sum_blocked
from .tiling import Tiling, static


def sized_launch(sizes: Sizes, sig: Signature, programs: SymInt) -> tuple[int, tuple[SymInt, ...], tuple[Any, ...]]:
    """A bucket kernel's launch (after its body has spelled every size it uses): the size parameters
    appended to `sig`, the programs at the plan's shape with their expression (the grid per shape), and the
    arguments at the plan's shape (host descriptors' shapes as values)."""
    sizes.add_params(sig)
    return evaluate(programs, sizes.env), (programs,), tuple(a.at_shape(sizes.env) for a in sig.args)


def divisible_text(sizes: Sizes) -> Callable[[SymInt], str]:
    """`sizes.text`, but a dynamic size that is a multiple of a constant (a stride: `768*seq`) spelled as
    the parameter of its quotient times that constant, `(sz0 * 768)`, so that Triton knows its
    divisibility (aligned, vectorised loads and stores through offsets it scales; a size parameter is
    never specialised on). Where the size can pass int32 the product is left to the parameter."""

    def text(value: SymInt) -> str:
        if isinstance(value, Expr):
            d = known_divisor(value)
            if d > 1 and sizes.max(value) <= INT32_LIMIT:
                return f"({sizes.text(value // d)} * {d})"
        return sizes.text(value)

    return text


@dataclass(frozen=True)
class MainLoop:
    """A main loop's lines and the names of its accumulators, one per output tile of the program (one,
    but conv_wgrad's TAPS programs hold one per tap)."""

    lines: list[str]
    accs: tuple[str, ...] = ("acc",)


class Strategy(Protocol):
    """A way of running a config (TileMatch.strategy): its estimated µs and its kernels."""

    def cost(self, k: TileKnobs) -> float | None: ...

    def kernels(self, k: TileKnobs) -> Generated: ...


KT = TypeVar("KT", contravariant=True)


class KernelParts(Protocol[KT]):
    """What the shared path (TileMatch.build) asks of the main kernel's maker: a TileLoop (TileKnobs), or
    another family's maker (the depthwise row strips, RowStripKnobs)."""

    writes_partials: ClassVar[bool]

    def check_knobs(self, k: KT) -> None: ...

    def tiling(self, k: KT) -> Tiling: ...

    def constexprs(self, k: KT) -> dict[str, int]: ...

    def meta(self, k: KT) -> tuple[tuple[str, Any], ...]: ...

    def programs(self, tiling: Tiling, k: KT) -> SymInt: ...

    def body(self, ctx: Context, sig: Signature, k: KT, partials: int | None) -> list[str]: ...


class TileLoop:
    """A main-loop strategy of a TileMatch: its trip count and lines, what its knobs must satisfy, and
    where its accumulators go when they are partials. `writes_partials`: the main kernel always writes fp32
    partials that a combine launch sums and runs the epilogue on (a loop whose accumulator rows are not the
    output's rows); `tensor_core`: it multiplies with tl.dot (BLOCK_K >= 16)."""

    writes_partials: ClassVar[bool] = False
    tensor_core: ClassVar[bool] = True

    def __init__(self, m: TileMatch) -> None:
        self.m = m

    def check_knobs(self, k: TileKnobs) -> None:
        """Typed errors for knobs this loop cannot run on the match's piece."""
        if self.tensor_core and k.BLOCK_K is not None and k.BLOCK_K < 16:
            raise AttributeValueError(
                f"BLOCK_K={k.BLOCK_K} must be a power of two >= 16 (tl.dot needs it)",
                rule="triton.gemm.knob",
                hint="pick BLOCK_K from 16, 32, 64, 128, 256",
            )

    def iterations(self, k: TileKnobs) -> int:
        """Main-loop trip count (split-K divides it)."""
        return 1

    # what the shared path asks of the loop: by default the match's answers
    def tiling(self, k: TileKnobs) -> Tiling:
        return self.m.tiling(k)

    def constexprs(self, k: TileKnobs) -> dict[str, int]:
        return self.m.constexprs(k)

    def meta(self, k: TileKnobs) -> tuple[tuple[str, Any], ...]:
        return self.m.meta(k)

    @abstractmethod
    def lines(self, ctx: Context, sig: Signature, k: TileKnobs, lo: str, hi: str) -> MainLoop:
        """Lines after the tile header that leave the accumulators ([BLOCK_M, BLOCK_N])."""

    def store_partials(self, ctx: Context, sig: Signature, k: TileKnobs, loop: MainLoop, offset: int) -> list[str]:
        """The main kernel's end under split-K: each accumulator's partial tile into scratch at `offset`."""
        lines: list[str] = []
        for j, acc in enumerate(loop.accs):
            lines += (
                ctx.tiling.tap_lines(j) + ([f"acc = {acc}"] if acc != "acc" else []) + split_store(ctx, sig, offset)
            )
        return lines

    def body(self, ctx: Context, sig: Signature, k: TileKnobs, partials: int | None) -> list[str]:
        """The main kernel's body: one tile per program, or (PERSISTENT) a grid-stride loop over tiles; the
        tile's header, its share of the main loop, then its partials (at scratch offset `partials`) or
        the epilogue."""
        m, tiling = self.m, ctx.tiling
        persistent = k.persistent
        tile = tiling.header(with_split=True, pid="work" if persistent else "tl.program_id(0)")
        split_lines, lo, hi = split_range(self.iterations(k), tiling.split)
        tile += split_lines
        loop = self.lines(ctx, sig, k, lo, hi)
        tile += loop.lines
        if partials is not None:
            tile += self.store_partials(ctx, sig, k, loop, partials)
        else:
            for j, acc in enumerate(loop.accs):
                tile += tiling.tap_lines(j) + epilogue(ctx, sig, acc, k.subtile)
        body = m.setup(ctx, sig, k)
        if not persistent:
            return body + tile
        # FLATTEN=1: the tile loop and the K loop become one loop for Triton's pipeliner, which then loads
        # the next tile's first K slices during this tile's epilogue (short-K GEMMs)
        work, programs = tiling.split * tiling.per_split, self.programs(tiling, k)
        body.append(
            f"for work in tl.range(tl.program_id(0), {tiling.text(work)}, {programs}, flatten={bool(k.FLATTEN)}):"
        )
        return body + ["    " + line for line in tile]

    def programs(self, tiling: Tiling, k: TileKnobs) -> SymInt:
        """The main launch's programs (an expression where the tile count is dynamic; a persistent
        kernel's are then PERSISTENT at every shape: programs past the tiles loop zero times)."""
        work = tiling.split * tiling.per_split
        if k.persistent:
            return k.persistent if isinstance(work, Expr) else min(work, k.persistent)
        return work


class Combine:
    """How the split-K launch after the main kernel sums the partials and runs the epilogue (the default:
    finer tiles, ~2 programs per SM (EPI_M / EPI_N set them), one slice a step)."""

    def tiling(self, m: TileMatch, tiling: Tiling, k: TileKnobs) -> Tiling:
        return epilogue_tiling(tiling, k, m.device, static if m.sizes is None else m.sizes.least)

    def sum_lines(self, ctx: Context, sig: Signature, offset: int) -> list[str]:
        return split_sum(ctx, sig, offset)

    def subtile(self, tiling: Tiling, etiling: Tiling, k: TileKnobs) -> int:
        return k.subtile if etiling.block_n == tiling.block_n else 1

    def constexprs(self, tiling: Tiling, etiling: Tiling, interpret: bool) -> dict[str, int]:
        return {"BLOCK_M": etiling.block_m, "BLOCK_N": etiling.block_n}

    def warps(self, etiling: Tiling, k: TileKnobs) -> int:
        return k.warps if etiling.block_m * etiling.block_n >= 16384 else 4


class BlockedCombine(Combine):
    """Finer tiles down to 16 x 16 (COMBINE_M / COMBINE_N set them), BLOCK_S partial slices per pipelined
    load and a fixed-order sum over them, 4 warps: for the deep splits of conv_wgrad."""

    def tiling(self, m: TileMatch, tiling: Tiling, k: TileKnobs) -> Tiling:
        bm, bn = tiling.block_m, tiling.block_n
        if k.COMBINE_M is not None or k.COMBINE_N is not None:
            bm, bn = k.COMBINE_M or bm, k.COMBINE_N or bn
        else:
            want = 2 * m.device.sm_count
            while bm * bn > 256:
                if static(Tiling(tiling.space, bm, bn).per_split) >= want:
                    break
                if bm >= bn and bm > 16:
                    bm //= 2
                elif bn > 16:
                    bn //= 2
                else:
                    break
        return Tiling(tiling.space, bm, bn, 1, tiling.split, tiling.big, text=tiling.text)

    def sum_lines(self, ctx: Context, sig: Signature, offset: int) -> list[str]:
        return split_sum_blocked(ctx, sig, offset)

    def subtile(self, tiling: Tiling, etiling: Tiling, k: TileKnobs) -> int:
        return k.subtile

    def constexprs(self, tiling: Tiling, etiling: Tiling, interpret: bool) -> dict[str, int]:
        return {
            "BLOCK_M": etiling.block_m,
            "BLOCK_N": etiling.block_n,
            "BLOCK_S": slice_block(tiling.split, etiling, interpret),
        }

    def warps(self, etiling: Tiling, k: TileKnobs) -> int:
        return 4


class TileTemplate(Template):
    """A template whose kernels compute one output tile per program with a main loop and then run the
    shared epilogue. Subclasses give the main op kinds, the output space and their match class."""

    main_kinds: tuple[str, ...] = ()
    main_label = ""
    splits_k = True  # whether SPLIT_K > 1 is meaningful (the main loop reduces)
    dot_roles: tuple[str, ...] = ()  # the main op's inputs that tl.dot multiplies (A, B), if it does
    sibling_mains = False  # whether a piece may hold products of the same A beside the main op (analyze)
    whole_reductions = False  # whether the epilogue may reduce both tile axes (Reduce.along "all")
    knob_class = TileKnobs
    match_class: ClassVar[type[TileMatch]]

    def space(self, main: Node, piece: Piece) -> OutputSpace:
        raise NotImplementedError

    def analyze(self, piece: Piece) -> tuple[GemmPiece | None, Support]:
        return analyze(piece, self.main_kinds, lambda n: self.space(n, piece), self.main_label, self.sibling_mains)

    def match(self, piece: Piece, device: Device) -> Support | TileMatch:
        if not piece.kind_set & set(self.main_kinds):
            return Support.no(f"the piece has no {self.main_label}")
        gp, verdict = self.analyze(piece)
        if gp is None:
            return verdict
        whole = next((r.node for r in gp.reductions if r.along == "all"), None)
        if whole is not None and not self.whole_reductions:
            return Support.no(
                f"{whole.label()} reduces the rows and the columns of the {self.main_label}'s output; the "
                f"{self.name} template's epilogue reduces one of them (the matmul template reduces both)",
                whole,
            )
        if DataType.DOUBLE in (gp.main.compute_data_type, gp.tensor(gp.out).data_type):
            return Support.no(
                f"{gp.main.label()} computes or returns DOUBLE: the templates accumulate in fp32, not float64", gp.main
            )
        m = self.match_class(self, gp, device)
        verdict = m.check()
        return m if verdict.ok else verdict


# knobs of TileKnobs that only some templates take (TileMatch.own_knobs), with who takes them
_OWNED_KNOBS = {
    "WCOPY": "the depthwise template's pixel tiles",
    "UNROLL": "the depthwise template's pixel tiles",
    "WS": "the matmul template (its warp-specialized Gluon kernel)",
}


class TileMatch(Match[TileKnobs], TileLoop):
    """A GEMM-class piece matched: its analysis `gp` (GemmPiece) and the device. The match is its own plain
    main loop (TileLoop) unless `loop(knobs)` returns another strategy."""

    template: TileTemplate
    combine: ClassVar[Combine] = Combine()
    # where the match is over a symbolic piece (sizes.symbolic_piece) and its kernel takes its dynamic
    # sizes at run time: the size parameters (the template's `tiling` spells sizes by `sizes.text`)
    sizes: Sizes | None = None
    # the knobs of _OWNED_KNOBS this template takes (the depthwise pixel tiles' WCOPY and UNROLL, matmul's WS)
    own_knobs: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, template: TileTemplate, gp: GemmPiece, device: Device) -> None:
        Match.__init__(self, template, gp.piece, device)
        TileLoop.__init__(self, self)
        self.gp = gp

    # -- verdict and knobs ------------------------------------------------------------------------------
    def check(self) -> Support:
        """Whether the template runs the piece on the device; by default, whether tl.dot multiplies the
        types of the `dot_roles` operands."""
        if self.template.dot_roles:
            a, b = (self.gp.operand(role).data_type for role in self.template.dot_roles)
            kind = dot_kind(a, b, interpret=self.interpret, native_fp8=self.native_fp8)
            if isinstance(kind, str):
                return Support.no(kind, self.gp.main)
        return Support.yes()

    def notes(self, knobs: TileKnobs) -> frozenset[NumericalNote]:
        kind = self.dot(knobs)
        return kind.notes if kind is not None else frozenset()

    # -- hooks --------------------------------------------------------------------------------------------
    def strategy(self, k: TileKnobs) -> Strategy:
        """What runs a config: the match itself (its plain kernel) by default."""
        if k.prologue_pass:
            raise AttributeValueError(
                f"PROLOGUE_PASS is a knob of the conv_fprop and conv_wgrad templates, not of {self.template.name}",
                op=self.gp.main.label(),
                rule="triton.conv.prologue_pass",
                hint="drop PROLOGUE_PASS from this config",
            )
        return self

    def loop(self, k: TileKnobs) -> TileLoop:
        """The main-loop strategy of a config: the match itself by default."""
        return self

    def validate(self, k: TileKnobs) -> None:
        """Typed errors for knobs the template refuses whatever the config's loop; none by default."""

    def dot(self, k: TileKnobs) -> DotKind | None:
        """By default, how tl.dot multiplies the `dot_roles` operands (None: no tl.dot)."""
        roles = self.template.dot_roles
        if not roles:
            return None
        a, b = (self.gp.operand(role).data_type for role in roles)
        kind = dot_kind(
            a, b, interpret=self.interpret, fp32_precision=k.precision, native_fp8=self.native_fp8, fp8_acc=k.FP8_ACC
        )
        assert not isinstance(kind, str)
        return kind

    @property
    def native_fp8(self) -> bool:
        """Whether fp8 operands go to tl.dot as they are loaded (`dot_kind`): templates whose operand tiles
        are read from memory without a prologue say so; by default they are widened to fp16."""
        return False

    def steps(self, k: TileKnobs) -> int:
        """The trip count of the config's main loop, whatever its strategy (`iterations` is the plain loop's)."""
        return self.loop(k).iterations(k)

    def constexprs(self, k: TileKnobs) -> dict[str, int]:
        """The tile's blocks: BLOCK_M, BLOCK_N, and BLOCK_K where a product over K runs in its steps."""
        out = {"BLOCK_M": k.BLOCK_M, "BLOCK_N": k.BLOCK_N}
        if self.template.dot_roles and k.BLOCK_K is not None:
            out["BLOCK_K"] = k.BLOCK_K
        return out

    def meta(self, k: TileKnobs) -> tuple[tuple[str, Any], ...]:
        """The main launch's meta after its constexprs."""
        return (("num_warps", k.warps), ("num_stages", k.stages))

    def tiling(self, k: TileKnobs) -> Tiling:
        split = k.split_k if self.template.splits_k else 1
        sp = self.gp.space
        if self.sizes is not None:  # offsets int64 where the bucket's largest shape needs them (partials too)
            p = self.gp.piece
            big = self.sizes.needs_int64(p.tensor(u) for u in (*p.inputs, *p.outputs))
            big = big or (split > 1 and self.sizes.max(sp.partials(split)) > INT32_LIMIT)
            return Tiling(sp, k.BLOCK_M, k.BLOCK_N, k.group_m, split, big, text=divisible_text(self.sizes))
        scratch_extent = sp.partials(split) if split > 1 else 0
        return Tiling(sp, k.BLOCK_M, k.BLOCK_N, k.group_m, split, needs_int64(self.gp, scratch_extent))

    def setup(self, ctx: Context, sig: Signature, k: TileKnobs) -> list[str]:
        """Lines run once per program before any tile (tensor descriptors); empty by default."""
        return []

    def prelude(self, ctx: Context, k: TileKnobs) -> list[str]:
        """Module-level source the kernels need (e.g. the TMA scratch allocator); empty by default."""
        return []

    # -- the protocol ---------------------------------------------------------------------------------------
    def estimate(self, knobs: TileKnobs) -> float | None:
        return self.strategy(knobs).cost(knobs)

    def cost(self, k: TileKnobs) -> float | None:
        """Estimated µs of the plain kernel of a config on the match's device (None: no model)."""
        return None

    def generate(self, knobs: TileKnobs) -> Generated:
        for knob, owner in _OWNED_KNOBS.items():
            if getattr(knobs, knob, None) and knob not in self.own_knobs:
                raise AttributeValueError(
                    f"{knob} is a knob of {owner}, not of {self.template.name}",
                    op=self.gp.main.label(),
                    rule="triton.gemm.knob",
                    hint=f"drop {knob} from this config",
                )
        return self.strategy(knobs).kernels(knobs)

    def kernels(self, k: TileKnobs) -> Generated:
        """The config's plain kernels: its main loop's, through the shared path."""
        self.validate(k)
        return self.build(self.loop(k), k)

    def build(self, loop: KernelParts[Any], k: Any) -> Generated:
        """The shared path (see the module docstring): `loop`'s kernel, with `k` its knobs."""
        loop.check_knobs(k)
        gp = self.gp
        tiling = loop.tiling(k)
        ctx = make_context(gp, tiling, self.dot(k), self.interpret, self.sizes)
        ctx.sm_count = self.device.sm_count
        partials = tiling.split > 1 or loop.writes_partials
        acc_off = None
        if partials:  # the epilogue launch owns the reductions (their partials follow its tiles)
            ctx.scratch, ctx.reductions = Scratch(), []
            sp = gp.space  # (a bucket kernel's partials: laid out for its largest shape, indexed by its sizes)
            acc_off = ctx.scratch.alloc(ctx.largest(sp.partials(tiling.split) * 4))
        functions: list[str] = list(self.prelude(ctx, k))
        sig = Signature()
        body = loop.body(ctx, sig, k, acc_off)
        constexprs = loop.constexprs(k)
        programs = loop.programs(tiling, k)
        sizes, grid_expr = self.sizes, None
        args = tuple(sig.args)
        if sizes is not None:  # the size parameters after the others; the grid evaluated per shape
            programs, grid_expr, args = sized_launch(sizes, sig, programs)
        assert isinstance(programs, int)
        functions += [source for source, _ in ctx.before]
        functions += ctx.functions
        functions.append(sig.source("kernel", list(constexprs), body))
        launches = [
            *(launch for _, launch in ctx.before),
            Launch(
                "kernel",
                (programs,),
                args,
                (*constexprs.items(), *loop.meta(k)),
                grid_expr=grid_expr,
            ),
        ]
        plans, plan_ctx = ctx.reductions, ctx
        if acc_off is not None:
            plan_ctx = self.epilogue_launch(ctx, k, acc_off, functions, launches)
            plans = plan_ctx.reductions
        add_combines(plans, plan_ctx, functions, launches)
        if sizes is not None:  # (after every kernel: the combine launches' sizes too)
            functions.insert(0, sizes.declaration())
        source = module_source(*functions, gluon=ctx.gluon)
        # "needs_allocator": device-side tensor descriptors take global scratch at launch
        notes = frozenset({"needs_allocator"}) if "tl.make_tensor_descriptor" in source else frozenset()
        # (a bucket kernel's scratch, the reductions' partials, is laid out for the bucket's largest shape)
        return Generated(source, tuple(launches), ctx.scratch.size, notes, bucket_scratch=sizes is not None)

    def epilogue_launch(
        self, ctx: Context, k: TileKnobs, offset: int, functions: list[str], launches: list[Launch]
    ) -> Context:
        """The launch after a main kernel that wrote partials: it sums them on its own, finer tiles (enough
        programs to stream the partials), runs the epilogue and owns the reductions' partials; its context."""
        combine, tiling = self.combine, ctx.tiling
        etiling = combine.tiling(self, tiling, k)
        ectx = dataclasses.replace(ctx, tiling=etiling)
        ectx.reductions = [ReductionPlan.make(r, ectx) for r in self.gp.reductions]
        esig = Signature()
        ebody = (
            etiling.header(with_split=False)
            + combine.sum_lines(ectx, esig, offset)
            + epilogue(ectx, esig, "acc", combine.subtile(tiling, etiling, k))
        )
        constexprs = combine.constexprs(tiling, etiling, ctx.interpret)
        programs, grid_expr, args = etiling.per_split, None, tuple(esig.args)
        if self.sizes is not None:
            programs, grid_expr, args = sized_launch(self.sizes, esig, programs)
        functions.append(esig.source("kernel_epilogue", list(constexprs), ebody))
        launches.append(
            Launch(
                "kernel_epilogue",
                (static(programs),),
                args,
                (*constexprs.items(), ("num_warps", combine.warps(etiling, k))),
                grid_expr=grid_expr,
            )
        )
        return ectx
