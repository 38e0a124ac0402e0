"""The GEMM-class template base: matching, knobs, generation of the whole kernel module."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ....core.config import NumericalNote, Support
from ....core.device import Device
from ....core.dtypes import DataType
from ....core.errors import AttributeValueError
from ....core.ir import Node
from ....core.piece import Piece
from ..templates.base import Generated, Launch, Template, module_source
from .analysis import GemmPiece, analyze
from .dots import DotKind, dot_kind
from .epilogue import Context, ReductionPlan, add_combines, epilogue, make_context, needs_int64
from .scratch import Scratch, Signature
from .space import OutputSpace
from .splitk import epilogue_tiling, split_range, split_store, split_sum
from .tiling import Tiling


class TileTemplate(Template):
    """A template whose kernels compute one output tile per program with a main loop and then run
    the shared epilogue. Subclasses give the main op kinds, the output space, extra checks, knob
    candidates and the main loop."""

    main_kinds: tuple[str, ...] = ()
    main_label = ""
    splits_k = True  # whether SPLIT_K > 1 is meaningful (the main loop reduces)
    dot_roles: tuple[str, ...] = ()  # the main op's inputs that tl.dot multiplies (A, B), if it does

    # -- subclass hooks --
    def space(self, main: Node, piece: Piece) -> OutputSpace:
        raise NotImplementedError

    def check(self, gp: GemmPiece, device: Device) -> Support:
        """By default, whether tl.dot multiplies the types of the `dot_roles` operands."""
        if self.dot_roles:
            a, b = (gp.operand(role).data_type for role in self.dot_roles)
            kind = dot_kind(a, b, interpret=not device.is_cuda)
            if isinstance(kind, str):
                return Support.no(kind, gp.main)
        return Support.yes()

    def dot(self, gp: GemmPiece, knobs: Mapping[str, Any], device: Device) -> DotKind | None:
        """By default, how tl.dot multiplies the `dot_roles` operands (None: no tl.dot)."""
        if not self.dot_roles:
            return None
        a, b = (gp.operand(role).data_type for role in self.dot_roles)
        kind = dot_kind(a, b, interpret=not device.is_cuda, fp32_precision=knobs.get("fp32_precision", "tf32"))
        assert not isinstance(kind, str)
        return kind

    def iterations(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> int:
        """Main-loop trip count (split-K divides it)."""
        return 1

    def mainloop(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any], lo: str, hi: str) -> list[str]:
        """Lines after the tile header that leave `acc` ([BLOCK_M, BLOCK_N])."""
        raise NotImplementedError

    def constexprs(self, knobs: Mapping[str, Any]) -> dict[str, int]:
        """The tile's blocks: BLOCK_M, BLOCK_N, and BLOCK_K where a product over K runs in its steps."""
        out = {"BLOCK_M": int(knobs["BLOCK_M"]), "BLOCK_N": int(knobs["BLOCK_N"])}
        if self.dot_roles and "BLOCK_K" in knobs:
            out["BLOCK_K"] = int(knobs["BLOCK_K"])
        return out

    # -- Template --
    def analyze(self, piece: Piece) -> tuple[GemmPiece | None, Support]:
        return analyze(piece, self.main_kinds, lambda n: self.space(n, piece), self.main_label)

    def analyzed(self, piece: Piece) -> GemmPiece:
        """The analysis of a piece to generate; an error where the template does not match it."""
        gp, verdict = self.analyze(piece)
        if gp is None:
            raise AttributeValueError(f"the {self.name} template cannot run this piece: {verdict.reason}",
                                      op=verdict.node.label() if verdict.node else None,
                                      rule="triton.gemm.match", hint="ask the engine which template matches")
        return gp

    def match(self, piece: Piece, device: Device) -> Support:
        if not piece.kind_set & set(self.main_kinds):
            return Support.no(f"the piece has no {self.main_label}")
        gp, verdict = self.analyze(piece)
        if gp is None:
            return verdict
        if DataType.DOUBLE in (gp.main.compute_data_type, gp.tensor(gp.out).data_type):
            return Support.no(f"{gp.main.label()} computes or returns DOUBLE: the templates accumulate in fp32, "
                              "not float64", gp.main)
        return self.check(gp, device)

    def estimate(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> float | None:
        """Estimated time of a config in microseconds on `device` (None: no model)."""
        return None

    def notes(self, piece: Piece, knobs: Mapping[str, Any], device: Device) -> frozenset[NumericalNote]:
        """Numerical notes of a config (tf32 products), for the engine's EngineConfig."""
        gp, _ = self.analyze(piece)
        if gp is None:
            return frozenset()
        kind = self.dot(gp, knobs, device)
        return kind.notes if kind is not None else frozenset()

    def tiling(self, gp: GemmPiece, knobs: Mapping[str, Any]) -> Tiling:
        split = int(knobs.get("SPLIT_K", 1)) if self.splits_k else 1
        sp = gp.space
        scratch_extent = split * sp.nbatch * sp.groups * sp.m * sp.n if split > 1 else 0
        return Tiling(sp, int(knobs["BLOCK_M"]), int(knobs["BLOCK_N"]), int(knobs.get("GROUP_M", 8)),
                      split, needs_int64(gp, scratch_extent))

    def setup(self, ctx: Context, sig: Signature, knobs: Mapping[str, Any]) -> list[str]:
        """Lines run once per program before any tile (tensor descriptors); empty by default."""
        return []

    def prelude(self, ctx: Context, knobs: Mapping[str, Any]) -> list[str]:
        """Module-level source the kernels need (e.g. the TMA scratch allocator); empty by default."""
        return []

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        gp = self.analyzed(piece)
        check_knobs(knobs)
        tiling = self.tiling(gp, knobs)
        ctx = make_context(gp, tiling, self.dot(gp, knobs, device), not device.is_cuda)
        ctx.sm_count = device.sm_count
        if tiling.split > 1:  # the epilogue launch owns the reductions (their partials follow its tiles)
            ctx.scratch, ctx.reductions = Scratch(), []
        constexprs = self.constexprs(knobs)
        warps = int(knobs.get("num_warps", 4))
        meta = (*constexprs.items(), ("num_warps", warps), ("num_stages", int(knobs.get("num_stages", 2))))
        functions: list[str] = list(self.prelude(ctx, knobs))
        launches: list[Launch] = []
        sig = Signature()
        work = tiling.split * tiling.per_split
        persistent = int(knobs.get("PERSISTENT", 0))
        programs = min(work, persistent) if persistent else work
        # one tile per program, or (persistent) a grid-stride loop over tiles
        tile = tiling.header(with_split=True, pid="work" if persistent else "tl.program_id(0)")
        split_lines, lo, hi = split_range(self.iterations(gp, knobs), tiling.split)
        tile += split_lines
        tile += self.mainloop(ctx, sig, knobs, lo, hi)
        acc_off = -1
        plans, plan_ctx = ctx.reductions, ctx
        ectx = ctx
        if tiling.split > 1:
            # the main kernel stores partial tiles; the epilogue launch sums them on its own, finer
            # tiles (enough programs to stream the partials) and owns the reductions' partials
            acc_bytes = tiling.split * gp.space.nbatch * gp.space.groups * gp.space.m * gp.space.n * 4
            acc_off = ctx.scratch.alloc(acc_bytes)
            tile += split_store(ctx, sig, acc_off)
            ectx = dataclasses.replace(ctx, tiling=epilogue_tiling(tiling, knobs, device))
            ectx.reductions = [ReductionPlan.make(r, ectx) for r in gp.reductions]
            plans, plan_ctx = ectx.reductions, ectx
        else:
            tile += epilogue(ctx, sig, "acc", int(knobs.get("EPILOGUE_SUBTILE", 1)))
        body = self.setup(ctx, sig, knobs)
        if persistent:
            # FLATTEN=1: the tile loop and the K loop become one loop for Triton's pipeliner, which then
            # loads the next tile's first K slices during this tile's epilogue (short-K GEMMs)
            flatten = bool(int(knobs.get("FLATTEN", 0)))
            body.append(f"for work in tl.range(tl.program_id(0), {work}, {programs}, flatten={flatten}):")
            body += ["    " + line for line in tile]
        else:
            body += tile
        functions.append(sig.source("kernel", list(constexprs), body))
        launches.append(Launch("kernel", (programs,), tuple(sig.args), meta))
        if tiling.split > 1:
            et = ectx.tiling
            esig = Signature()
            subtile = int(knobs.get("EPILOGUE_SUBTILE", 1)) if et.block_n == tiling.block_n else 1
            ebody = et.header(with_split=False) + split_sum(ectx, esig, acc_off) + \
                epilogue(ectx, esig, "acc", subtile)
            ewarps = warps if et.block_m * et.block_n >= 16384 else 4
            emeta = (("BLOCK_M", et.block_m), ("BLOCK_N", et.block_n), ("num_warps", ewarps))
            functions.append(esig.source("kernel_epilogue", ["BLOCK_M", "BLOCK_N"], ebody))
            launches.append(Launch("kernel_epilogue", (et.per_split,), tuple(esig.args), emeta))
        add_combines(plans, plan_ctx, functions, launches)
        source = module_source(*functions)
        # "needs_allocator": device-side tensor descriptors take global scratch at launch
        notes = frozenset({"needs_allocator"}) if "tl.make_tensor_descriptor" in source else frozenset()
        return Generated(source, tuple(launches), ctx.scratch.size, notes)


def check_knobs(knobs: Mapping[str, Any]) -> None:
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "EPI_M", "EPI_N"):
        value = knobs.get(key)
        if value is not None and (int(value) < 16 or int(value) & (int(value) - 1)):
            raise AttributeValueError(
                f"{key}={value} must be a power of two >= 16 (tl.dot and tl.arange need it)",
                rule="triton.gemm.knob", hint=f"pick {key} from 16, 32, 64, 128, 256",
            )
    if int(knobs.get("PERSISTENT", 0)) < 0:
        raise AttributeValueError(f"PERSISTENT={knobs['PERSISTENT']} must be 0 (one tile per program) or the "
                                  "number of programs", rule="triton.gemm.knob",
                                  hint="use 0, or about the number of SMs (times the programs per SM)")
    flatten = int(knobs.get("FLATTEN", 0))
    if flatten not in (0, 1) or (flatten and (not int(knobs.get("PERSISTENT", 0)) or int(knobs.get("SPLIT_K", 1)) > 1)):
        # (a split of K has empty K ranges, which Triton's loop flattening has miscompiled: triton#11656)
        raise AttributeValueError(f"FLATTEN={knobs['FLATTEN']} must be 0, or 1 with PERSISTENT and SPLIT_K=1",
                                  rule="triton.gemm.knob", hint="FLATTEN flattens a persistent kernel's tile loop")
    if int(knobs.get("EPILOGUE_SUBTILE", 1)) not in (1, 2):
        raise AttributeValueError(f"EPILOGUE_SUBTILE={knobs['EPILOGUE_SUBTILE']} must be 1 or 2",
                                  rule="triton.gemm.knob", hint="use 2 to run the epilogue on column halves")
    split = int(knobs.get("SPLIT_K", 1))
    if split < 1:
        raise AttributeValueError(f"SPLIT_K={split} must be >= 1", rule="triton.gemm.knob",
                                  hint="use 1 (no split) or a small factor such as 2-8")
