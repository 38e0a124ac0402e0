"""Per-channel and per-(sample, channel) normalizations as fused pieces: batchnorm training forward and
backward, batchnorm inference, instancenorm forward and backward, each with a pointwise prologue on
its full-size inputs (a residual add before batchnorm, relu_backward producing its gradient) and a
pointwise epilogue on its full-size output (relu, residual add, clips, casts, several outputs).

Training and backward pieces run in three launches and two passes over the input:
  1. stats:   a 2-D grid (chunks of the reduced axes x channel blocks [x samples for instancenorm]);
              each program keeps fp32 tile accumulators of the shifted values (x - K, K = x at the
              chunk's first element, which keeps the sums well conditioned), reduces them once and
              stores its partials (count, mean, M2; for backward sum(dy), sum(dy * (x - mean))) to
              scratch;
  2. combine: one program per channel block merges the chunks' partials exactly (total mean first,
              then M2 = sum(M2_i + n_i * (mean_i - mean)^2)), writes mean / inv_variance / running
              stats (or dscale / dbias) and the per-slot coefficients of the apply pass to scratch;
  3. apply:   y = (x - mean) * (scale * inv) + bias (or dx = a * ((dy - k1) - k2 * (x - mean))),
              then the epilogue, each output written once.
batchnorm_inference is the apply pass alone, its coefficients read from the op's inputs.

Layouts are whatever the strides say. The input's axes are grouped into B (the sample axis of
instancenorm), C (channels), P (reduced axes with strides above C's) and Q (reduced axes with strides
below C's). With Q empty (NHWC: C innermost) tiles are [rows of P, channels], channels contiguous;
otherwise (NCHW) tiles are [channels, Q], Q contiguous, and P is walked one index at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ....device import Device
from ....partition import Piece
from ...base import Support
from ..expr import round_in_compute
from ._norm_common import (
    Comp, Fusion, Params, TileIndexer, analyse, compute_of, is_big, make_emitter, memory_order, nest, pow2_ceil,
    scalar_expr,
)
from .base import Generated, Launch, Template, indent, module_source

FORWARD = ("batchnorm", "instancenorm")
BACKWARD = ("batchnorm_backward", "instancenorm_backward")
KINDS = (*FORWARD, *BACKWARD, "batchnorm_inference")
ALIGN = 256


@dataclass(frozen=True)
class Geometry:
    fusion: Fusion
    dims: tuple[int, ...]
    B: int  # samples with their own statistics (instancenorm), else 1
    C: int
    b_axes: tuple[int, ...]
    c_axes: tuple[int, ...]
    p_axes: tuple[int, ...]  # reduced axes outside C, memory order
    q_axes: tuple[int, ...]  # reduced axes inside C, memory order

    @property
    def kind(self) -> str:
        return self.fusion.norm.kind

    @property
    def P(self) -> int:
        return math.prod(self.dims[a] for a in self.p_axes)

    @property
    def Q(self) -> int:
        return math.prod(self.dims[a] for a in self.q_axes)

    @property
    def M(self) -> int:
        """Elements per statistic."""
        return self.P * self.Q

    @property
    def S(self) -> int:
        """Statistic slots (b * C + c)."""
        return self.B * self.C

    @property
    def channels_last(self) -> bool:
        return not self.q_axes


def geometry(fusion: Fusion) -> Geometry:
    x = fusion.x
    dims = x.dim
    instance = fusion.norm.kind.startswith("instancenorm")
    kept = {0, 1} if instance else {1}
    b_axes = (0,) if instance and dims[0] > 1 else ()
    c_axes = (1,) if dims[1] > 1 else ()
    reduced = [a for a in range(len(dims)) if a not in kept and dims[a] > 1]
    if c_axes:
        sc = x.stride[1]
        p_axes = memory_order([a for a in reduced if x.stride[a] >= sc], x.stride)
        q_axes = memory_order([a for a in reduced if x.stride[a] < sc], x.stride)
    else:  # one channel: walk every reduced axis as the contiguous one
        p_axes, q_axes = (), memory_order(reduced, x.stride)
    return Geometry(fusion, dims, dims[0] if b_axes else 1, dims[1], b_axes, c_axes, p_axes, q_axes)


# -- knobs ------------------------------------------------------------------------------------------


def _best_q_block(q: int, cap: int) -> int:
    """The largest power-of-2 block (<= cap) that wastes under ~6% of the Q axis in its ragged edge."""
    best = min(pow2_ceil(q), 16)
    b = 16
    while b <= min(cap, pow2_ceil(q)):
        if -(-q // b) * b <= q * 1.0625 or b <= best:
            best = b
        b *= 2
    return best


def heuristic_knobs(g: Geometry, device: Device, variant: int = 0) -> dict[str, Any]:
    """Tile sizes and chunking. On the GPU: stats tiles of ~4096 elements with at least 4 programs per
    SM (chunks x channel blocks x samples), apply tiles of 4096 elements (8 warps, >= 8 elements a
    thread); on the CPU interpreter small tiles (few programs, but several chunks and channel blocks
    so every code path runs)."""
    gpu = device.is_cuda
    cp = pow2_ceil(g.C)
    if g.channels_last:
        if gpu:
            bc = min(cp, (64, 32, 128)[variant % 3])
            br = max(1, 4096 // bc)
            abc = min(cp, 128 if variant % 2 == 0 else 64)
            abr = max(1, 4096 // abc)
        else:
            bc, br, abc, abr = min(cp, 4), 8, min(cp, 8), 16
        tiles = -(-g.P // br)
    else:
        if gpu:
            br = _best_q_block(g.Q, 1024 if variant % 2 == 0 else 256)
            bc = min(cp, max(1, 4096 // br))
            abr = _best_q_block(g.Q, 1024)
            abc = min(cp, max(1, 4096 // abr))
        else:
            br, bc = min(pow2_ceil(g.Q), 8), min(cp, 4)
            abr, abc = min(pow2_ceil(g.Q), 16), min(cp, 8)
        tiles = g.P * -(-g.Q // br)
    cblocks = -(-g.C // bc)
    want = (4 * device.sm_count) if gpu else 3
    chunks = max(1, min(tiles, -(-want // (cblocks * g.B))))
    chunk = -(-tiles // chunks)
    bs = min(cp, 32 if gpu else 4)
    return {
        "BR": br, "BC": bc, "CHUNK": chunk, "W": 4 if br * bc <= 4096 else 8,
        "ABR": abr, "ABC": abc, "AW": 8 if gpu and abr * abc >= 4096 else 4,
        "BS": bs, "CW": 4,
    }


# -- code generation ------------------------------------------------------------------------------


class _Gen:
    """Generates the launches of one piece."""

    def __init__(self, piece: Piece, g: Geometry, knobs: dict[str, Any]) -> None:
        self.piece = piece
        self.g = g
        self.k = knobs
        self.node = g.fusion.norm
        self.compute = compute_of(piece)
        self.acc_bytes = 8 if self.compute == "tl.float64" else 4
        self.scratch_dtype = "float64" if self.compute == "tl.float64" else "float32"
        self.big = is_big(piece)
        kind = g.kind
        self.forward = kind in FORWARD
        self.backward = kind in BACKWARD
        self.inference = kind == "batchnorm_inference"
        self.saved = self.backward and self.node.input("mean") is not None
        self.x_uid = self.node.input("input")
        self.grad_uid = self.node.input("grad") if self.backward else None
        self.y_uid = self.node.outputs[0]
        self.chunks = self._chunks()
        # scratch: partial arrays [chunks, S] then coefficient arrays [S]
        if self.forward:
            self.partials = ("cnt", "mu", "m2")
            self.coefs = ("mu", "sc", "sh")
        elif self.backward:
            self.partials = ("gd", "ge") if self.saved else ("cnt", "mu", "m2", "gd", "ge")
            self.coefs = ("mu", "a", "k1", "k2")
        else:
            self.partials, self.coefs = (), ()
        self.offsets: dict[str, int] = {}
        off = 0
        for name in self.partials:
            self.offsets["q_" + name] = off
            off += -(-self.chunks * g.S * self.acc_bytes // ALIGN) * ALIGN
        for name in self.coefs:
            self.offsets["c_" + name] = off
            off += -(-g.S * self.acc_bytes // ALIGN) * ALIGN
        self.scratch_bytes = off

    # helpers -----------------------------------------------------------------------------------------
    def pid(self, axis: int) -> str:
        return f"tl.program_id({axis}).to(tl.int64)" if self.big else f"tl.program_id({axis})"

    def scratch(self, params: Params, name: str) -> str:
        return params.scratch(name, self.offsets[name], self.scratch_dtype)

    def _tiles(self) -> int:
        g = self.g
        br = int(self.k["BR"])
        return -(-g.P // br) if g.channels_last else g.P * -(-g.Q // br)

    def _chunks(self) -> int:
        return -(-self._tiles() // int(self.k["CHUNK"]))

    def comps(self, *, p: str | None, q: str | None, c_axis: int | None, p_axis: int | None,
              q_axis: int | None, c: str = "cc") -> list[Comp]:
        g = self.g
        out = [Comp(g.b_axes, "bb", None), Comp(g.c_axes, c, c_axis)]
        if p is not None:
            out.append(Comp(g.p_axes, p, p_axis))
        if q is not None:
            out.append(Comp(g.q_axes, q, q_axis))
        return out

    def region(self, comps: list[Comp], masks: dict, zeros: dict | None, params: Params):
        indexer = TileIndexer(self.g.dims, comps, masks, zeros)
        return make_emitter(self.piece, self.compute, indexer, params)

    def full_values(self, em, nodes, grad: bool = True) -> tuple[str, str | None]:
        """Emit `nodes` (prologue) and return the expressions of x (and of the gradient)."""
        for n in nodes:
            em.emit(n)
        xv = em.operand(self.x_uid)
        gv = em.operand(self.grad_uid) if grad and self.grad_uid is not None else None
        return xv, gv

    def _tile_layout(self, bc: str) -> tuple[list[str], list[Comp], dict, dict]:
        """The channel index lines of a [rows, channels] (channels last) or [channels, Q] tile, its
        components, masks and zeros; the caller sets the row index (rp, or pp and qq)."""
        g = self.g
        cl = g.channels_last
        lines = [f"cc = {self.pid(1)} * {bc} + tl.arange(0, {bc})" + ("[None, :]" if cl else "[:, None]"),
                 f"cmask = cc < {g.C}"]
        if g.b_axes:
            lines.append(f"bb = {self.pid(2)}")
        if cl:
            comps = self.comps(p="rp", q=None, c_axis=1, p_axis=0, q_axis=None)
            masks = {frozenset(): None, frozenset({0}): "pmask", frozenset({1}): "cmask",
                     frozenset({0, 1}): "mask"}
        else:
            comps = self.comps(p="pp", q="qq", c_axis=0, p_axis=None, q_axis=1)
            masks = {frozenset(): None, frozenset({0}): "cmask", frozenset({1}): "qmask",
                     frozenset({0, 1}): "mask"}
        return lines, comps, masks, {0: "z0", 1: "z1"}

    # launch 1: statistics -----------------------------------------------------------------------------
    def stats_kernel(self) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        br, bc, chunk = int(k["BR"]), int(k["BC"]), int(k["CHUNK"])
        acc = self.compute
        nodes = self.g.fusion.stats_pass_nodes()
        head, comps, masks, zeros = self._tile_layout("BC")
        body = [f"pid_r = {self.pid(0)}", *head]
        cl = g.channels_last
        red_axis = 0 if cl else 1
        shape = "[BR, BC]" if cl else "[BC, BR]"
        # the shift K: x at the chunk's first element (or the saved mean for a backward)
        if cl:
            body += [f"p_lo = pid_r * {chunk * br}", f"p_hi = tl.minimum(p_lo + {chunk * br}, {g.P})",
                     "rp = p_lo"]
            shift_comps = self.comps(p="rp", q=None, c_axis=1, p_axis=None, q_axis=None)
            shift_masks = {frozenset(): None, frozenset({1}): "cmask"}
        else:
            nqb = -(-g.Q // br)
            tiles = g.P * nqb
            body += [f"t_lo = pid_r * {chunk}", f"t_hi = tl.minimum(t_lo + {chunk}, {tiles})",
                     f"pp = t_lo // {nqb}", f"qq = (t_lo % {nqb}) * BR"]
            shift_comps = self.comps(p="pp", q="qq", c_axis=0, p_axis=None, q_axis=None)
            shift_masks = {frozenset(): None, frozenset({0}): "cmask"}
        em = self.region(shift_comps, shift_masks, None, params)
        if self.saved:
            shift = em.operand(self.node.input("mean"))
        else:
            shift, _ = self.full_values(em, [n for n in nodes if self._feeds_x(n, nodes)], grad=False)
        body += [*em.lines, f"K = {shift}"]
        need_moments = not self.saved
        accs = (["a1", "a2"] if need_moments else []) + (["ad", "ae"] if self.backward else [])
        body += [f"{a} = tl.zeros({shape}, {acc})" for a in accs]
        em = self.region(comps, masks, zeros, params)
        xv, gv = self.full_values(em, nodes)
        if cl:
            loop = [
                "rp = p0 + tl.arange(0, BR)[:, None]",
                "pmask = rp < p_hi",
                "mask = pmask & cmask",
            ]
            header = "for p0 in range(p_lo, p_hi, BR):"
        else:
            loop = [
                f"pp = t // {nqb}",
                f"qq = (t % {nqb}) * BR + tl.arange(0, BR)[None, :]",
                f"qmask = qq < {g.Q}",
                "mask = cmask & qmask",
            ]
            header = "for t in range(t_lo, t_hi):"
        loop += em.lines
        loop.append(f"d = tl.where(mask, {xv} - K, 0.0)")
        if need_moments:
            loop += ["a1 += d", "a2 += d * d"]
        if self.backward:
            loop += [f"gr = tl.where(mask, {gv}, 0.0)", "ad += gr", "ae += gr * d"]
        body += nest(header, loop)
        if cl:
            body.append(f"n = (p_hi - p_lo).to({acc})")
        else:
            body.append(f"n = ((t_hi - t_lo) * BR - (t_hi // {nqb} - t_lo // {nqb}) * {nqb * br - g.Q}).to({acc})")
        sums = {a: f"tl.sum({a}, axis={red_axis}, keep_dims=True)" for a in accs}
        body += [f"s_{a} = {sums[a]}" for a in accs]
        slot = f"bb * {g.C} + cc" if g.b_axes else "cc"
        body.append(f"off = pid_r * {g.S} + {slot}")
        stores: dict[str, str] = {}
        if need_moments:
            body += ["mu = K + s_a1 / n", "m2 = s_a2 - s_a1 * s_a1 / n"]
            stores.update(cnt=f"n + tl.zeros_like(mu)", mu="mu", m2="m2")
        if self.backward:
            stores["gd"] = "s_ad"
            stores["ge"] = "s_ae" if self.saved else "s_ae - (mu - K) * s_ad"
        for name in self.partials:
            body.append(f"tl.store({self.scratch(params, 'q_' + name)} + off, {stores[name]}, mask=cmask)")
        src = params.signature("kernel_stats", ["BR", "BC"]) + "\n" + indent(body)
        cblocks = -(-g.C // bc)
        launch = Launch("kernel_stats", (self.chunks, cblocks, g.B), tuple(params.args),
                        (("BR", br), ("BC", bc), ("num_warps", int(k["W"]))))
        return src, launch

    def _feeds_x(self, node, nodes) -> bool:
        """Whether a stats-pass prologue node is an ancestor of x (the shift needs x only)."""
        needed = {self.x_uid}
        for n in reversed(nodes):
            if any(u in needed for u in n.output_uids()):
                needed.update(n.input_uids())
        return any(u in needed for u in node.output_uids())

    # launch 2: combine ----------------------------------------------------------------------------
    def combine_kernel(self) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        acc = self.compute
        tensors = self.piece.graph.tensors
        node = self.node
        bs = int(k["BS"])
        bk = max(2, min(pow2_ceil(self.chunks), max(16, 8192 // bs)))
        # per-slot tensors (stats, scale, running stats, dscale) are [1, BS] vectors over channels
        em = self.region([Comp(g.b_axes, "bb", None), Comp(g.c_axes, "cc", 1)],
                         {frozenset(): None, frozenset({1}): "cmask"}, {1: "zc"}, params)

        def take() -> list[str]:
            lines = list(em.lines)
            em.lines.clear()
            return lines

        def stored(role: str) -> int | None:
            u = node.output(role)
            return u if u is not None and u in self.piece.outputs else None

        def store(role: str, value: str) -> None:
            if (u := stored(role)) is not None:
                em.values[u] = value
                em.store(u)

        q = {name: self.scratch(params, "q_" + name) for name in self.partials}

        def ld(name: str) -> str:
            return f"tl.load({q[name]} + ko, mask=km, other=0.0)"

        def over_chunks(lines: list[str]) -> list[str]:
            return nest(f"for k0 in range(0, {self.chunks}, BK):",
                        ["kk = k0 + kk0", f"km = (kk < {self.chunks}) & cmask", f"ko = kk * {g.S} + slot", *lines])

        def zeros(*names: str) -> list[str]:
            return [f"{n} = tl.zeros([1, BS], {acc})" for n in names]

        red = "axis=0, keep_dims=True"
        per_slot: list[str] = [f"slot = bb * {g.C} + cc"]
        if self.saved:
            per_slot += zeros("t_d", "t_e")
            per_slot += over_chunks([f"t_d += tl.sum({ld('gd')}, {red})", f"t_e += tl.sum({ld('ge')}, {red})"])
            mean_v, inv_v = em.operand(node.input("mean")), em.operand(node.input("inv_variance"))
            per_slot += take() + [f"mean = {mean_v}", f"inv = {inv_v}"]
        else:
            # exact merge of the chunks: the total mean first, then M2 about it
            per_slot += zeros("t_n", "t_m")
            per_slot += over_chunks([f"n_i = {ld('cnt')}", f"t_n += tl.sum(n_i, {red})",
                                     f"t_m += tl.sum(n_i * {ld('mu')}, {red})"])
            per_slot += ["mean = t_m / tl.where(cmask, t_n, 1.0)", *zeros("t_2")]
            second = [f"n_i = {ld('cnt')}", f"dm = {ld('mu')} - mean", f"t_2 += tl.sum({ld('m2')} + n_i * dm * dm, {red})"]
            if self.backward:
                per_slot += zeros("t_d", "t_e")
                second += [f"d_i = {ld('gd')}", f"t_d += tl.sum(d_i, {red})", f"t_e += tl.sum({ld('ge')} + dm * d_i, {red})"]
            per_slot += over_chunks(second)
            eps = scalar_expr(node.input("epsilon"), tensors, params, acc)
            per_slot += [f"inv = 1.0 / tl.sqrt(t_2 / {float(g.M)!r} + {eps})"]
        gamma = em.operand(node.input("scale"))
        per_slot += take()
        if self.forward:
            coef = {"mu": "mean", "sc": f"{gamma} * inv", "sh": em.operand(node.input("bias"))}
            per_slot += take()
            store("mean", "mean")
            store("inv_variance", "inv")
            if node.kind == "batchnorm" and node.input("momentum") is not None:
                mom = scalar_expr(node.input("momentum"), tensors, params, acc)
                rm, rv = em.operand(node.input("in_running_mean")), em.operand(node.input("in_running_var"))
                unbiased = f"t_2 / {float(max(g.M - 1, 1))!r}"
                per_slot += take() + [f"r_mean = (1.0 - {mom}) * {rm} + {mom} * mean",
                                      f"r_var = (1.0 - {mom}) * {rv} + {mom} * {unbiased}"]
                store("next_running_mean", "r_mean")
                store("next_running_var", "r_var")
            per_slot += take()
        else:
            m = float(g.M)
            coef = {"mu": "mean", "a": f"{gamma} * inv", "k1": f"t_d / {m!r}", "k2": f"inv * inv * t_e / {m!r}"}
            per_slot += ["t_ds += inv * t_e", "t_db += t_d"]
        for name in self.coefs:
            per_slot.append(f"tl.store({self.scratch(params, 'c_' + name)} + slot, {coef[name]}, mask=cmask)")
        body = [f"cc = {self.pid(0)} * BS + tl.arange(0, BS)[None, :]", f"cmask = cc < {g.C}", "zc = cc * 0",
                "kk0 = tl.arange(0, BK)[:, None]"]
        if self.backward:
            body += zeros("t_ds", "t_db")
        body += nest(f"for bb in range(0, {g.B}):", per_slot) if g.B > 1 else ["bb = 0", *per_slot]
        if self.backward:  # dscale, dbias sum over the samples too (instancenorm)
            store("dscale", "t_ds")
            store("dbias", "t_db")
            body += take()
        src = params.signature("kernel_combine", ["BS", "BK"]) + "\n" + indent(body)
        launch = Launch("kernel_combine", (-(-g.C // bs),), tuple(params.args),
                        (("BS", bs), ("BK", bk), ("num_warps", int(k["CW"]))))
        return src, launch

    # launch 3: apply --------------------------------------------------------------------------------
    def apply_kernel(self) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        abr, abc = int(k["ABR"]), int(k["ABC"])
        head, comps, masks, zeros = self._tile_layout("ABC")
        cl = g.channels_last
        if cl:
            body = [f"rp = {self.pid(0)} * ABR + tl.arange(0, ABR)[:, None]", f"pmask = rp < {g.P}", *head,
                    "mask = pmask & cmask", "z0 = rp * 0", "z1 = cc * 0"]
            grid = (-(-g.P // abr), -(-g.C // abc), g.B)
        else:
            nqb = -(-g.Q // abr)
            body = [f"t = {self.pid(0)}", f"pp = t // {nqb}", f"qq = (t % {nqb}) * ABR + tl.arange(0, ABR)[None, :]",
                    f"qmask = qq < {g.Q}", *head, "mask = cmask & qmask", "z0 = cc * 0", "z1 = qq * 0"]
            grid = (g.P * nqb, -(-g.C // abc), g.B)
        em = self.region(comps, masks, zeros, params)
        fusion = g.fusion
        xv, gv = self.full_values(em, fusion.prologue)
        node = self.node
        slot = f"bb * {g.C} + cc" if g.b_axes else "cc"
        if self.inference:
            mu, inv = em.operand(node.input("mean")), em.operand(node.input("inv_variance"))
            sc, sh = em.operand(node.input("scale")), em.operand(node.input("bias"))
            value = f"({xv} - {mu}) * {inv} * {sc} + {sh}"
        else:
            c = {name: f"tl.load({self.scratch(params, 'c_' + name)} + {slot}, mask=cmask, other=0.0)"
                 for name in self.coefs}
            em.lines += [f"k_{name} = {c[name]}" for name in self.coefs]
            if self.forward:
                value = f"({xv} - k_mu) * k_sc + k_sh"
            else:
                value = f"k_a * (({gv} - k_k1) - k_k2 * ({xv} - k_mu))"
        y = self.y_uid
        assert y is not None
        em.lines.append(f"v{y} = {value}")
        rounded = round_in_compute(f"v{y}", self.piece.tensor(y).data_type, self.compute)
        if rounded is not None:
            em.lines.append(f"v{y} = {rounded}")
        em.values[y] = f"v{y}"
        for n in fusion.epilogue:
            em.emit(n)
        for u in self.piece.outputs:
            if self.piece.tensor(u).dim == g.dims and u in em.values:
                em.store(u)
        body += em.lines
        src = params.signature("kernel_apply", ["ABR", "ABC"]) + "\n" + indent(body)
        launch = Launch("kernel_apply", grid, tuple(params.args),
                        (("ABR", abr), ("ABC", abc), ("num_warps", int(k["AW"]))))
        return src, launch

    def generate(self) -> Generated:
        sources, launches = [], []
        if not self.inference:
            for make in (self.stats_kernel, self.combine_kernel):
                s, launch = make()
                sources.append(s)
                launches.append(launch)
        s, launch = self.apply_kernel()
        sources.append(s)
        launches.append(launch)
        return Generated(module_source(*sources), tuple(launches), self.scratch_bytes)


class NormStatsTemplate(Template):
    name = "norm_stats"
    priority = 30

    def _geometry(self, piece: Piece) -> Geometry | Support:
        fusion = analyse(piece, KINDS, self.name)
        if isinstance(fusion, Support):
            return fusion
        g = geometry(fusion)
        if g.B > 65535:
            return Support.no(f"{g.B} samples exceed the grid's third axis (65535)", fusion.norm)
        return g

    def match(self, piece: Piece, device: Device) -> Support:
        g = self._geometry(piece)
        return g if isinstance(g, Support) else Support.yes()

    def candidates(self, piece: Piece, device: Device) -> list[dict[str, Any]]:
        g = self._geometry(piece)
        assert isinstance(g, Geometry)
        out: list[dict[str, Any]] = []
        for v in range(3):
            knobs = heuristic_knobs(g, device, v)
            if knobs not in out:
                out.append(knobs)
        return out

    def generate(self, piece: Piece, knobs: dict[str, Any], device: Device) -> Generated:
        g = self._geometry(piece)
        assert isinstance(g, Geometry)
        return _Gen(piece, g, knobs).generate()


TEMPLATE = NormStatsTemplate()
