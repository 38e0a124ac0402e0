"""Per-channel and per-(sample, channel) normalizations as fused pieces: batchnorm training forward and
backward, batchnorm inference, instancenorm forward and backward, each with a pointwise prologue on
its full-size inputs (a residual add before batchnorm, relu_backward producing its gradient) and a
pointwise epilogue on its full-size output (relu, residual add, clips, casts, several outputs).

Training and backward pieces run in three launches and two passes over the input:
  1. stats:   a 2-D grid (chunks of the reduced axes x channel blocks [x samples for instancenorm]);
              each program keeps fp32 tile accumulators of the shifted values (x - K, K = x at the
              slot's first element, the same in every chunk, which keeps the sums well conditioned),
              reduces them once and stores its partials (count, mean - K, M2 and, for a forward, the
              unshifted sum, which gives the mean output where |mean| < |mean - K|; for a backward
              sum(dy) and sum(dy * (x - mean_chunk))) to scratch. Its tile loop keeps several tiles in flight
              (knob ST: `tl.range(num_stages=ST)`, cp.async into shared memory; or knob PF: the next
              tile's loads issued into registers before this tile is used), as a pass that reads
              ~50 MB at bandwidth needs ~40 KB in flight per SM, which one tile a program is not;
  2. combine: one program per block of statistic slots (b * C + c) merges the chunks' partials
              exactly (total mean first, then M2 = sum(M2_i + n_i * (mean_i - mean)^2); every
              partial loaded once, with the per-slot parameters, when the chunks fit a block), writes
              mean / inv_variance / running stats (or dscale / dbias) and the per-slot coefficients
              of the apply pass to scratch (an instancenorm backward sums dscale / dbias over the
              samples in a 4th, tiny launch);
  3. apply:   y = ((x - K) - (mean - K)) * (scale * inv) + bias (or, for a backward,
              dx = a * ((dy - k1) - k2 * (x - mean)), a = scale * inv, k1 = mean(dy),
              k2 = inv^2 * mean(dy * (x - mean))), then the epilogue, each output written once. It
              reads first what the stats pass read last (knob ORDER), which L2 may still hold.
batchnorm_inference is the apply pass alone, its coefficients read from the op's inputs.

Layouts are whatever the strides say. The input's axes are grouped into B (the sample axis of
instancenorm), C (channels), P (reduced axes with strides above C's) and Q (reduced axes with strides
below C's). With Q empty (NHWC: C innermost) tiles are [rows of P, channels], channels contiguous;
otherwise (NCHW) tiles are [channels, Q], Q contiguous, and P is walked one index at a time.
"""

from __future__ import annotations

from ....core.config import Support
from ....core.piece import Piece
from ....memory.workspace import align_up
from ..knobs import StatsKnobs
from ._norm_common import (
    Comp,
    NormGen,
    NormMatch,
    NormTemplate,
    Params,
    PrefetchIndexer,
    RowIndexer,
    analyze,
    loop_header,
    make_emitter,
    nest,
    pow2_ceil,
    prefetched,
    renamed,
    scalar_expr,
)
from ._stats_geometry import BACKWARD, FORWARD, KINDS, StatsGeometry, candidate_knobs, geometry, stats_bytes
from .base import Generated, Launch, indent, module_source

# -- code generation ------------------------------------------------------------------------------


class _Gen(NormGen):
    """Generates the launches of one piece."""

    g: StatsGeometry

    def __init__(self, piece: Piece, g: StatsGeometry, knobs: StatsKnobs) -> None:
        super().__init__(piece, g, knobs)
        kind = g.kind
        self.forward = kind in FORWARD
        self.backward = kind in BACKWARD
        self.inference = kind == "batchnorm_inference"
        self.saved = self.backward and self.node.input("mean") is not None
        self.grad_uid = self.node.input("grad") if self.backward else None
        self.chunks = self._chunks()
        # scratch: partial arrays [chunks, S] then coefficient arrays [S]
        self.partials: tuple[str, ...]
        self.coefs: tuple[str, ...]
        if self.forward:
            # sx: the unshifted sum, for the mean output (mean = K + (mean - K) keeps only |K|'s absolute
            # precision, far from the mean's own where |mean| << |K|)
            self.partials = ("cnt", "mu", "m2", "sx")
            self.coefs = ("k0", "mu", "sc", "sh")
        elif self.backward:
            self.partials = ("gd", "ge") if self.saved else ("cnt", "mu", "m2", "gd", "ge")
            self.coefs = ("k0", "a", "k1", "k2") if self.saved else ("k0", "mu", "a", "k1", "k2")
        else:
            self.partials, self.coefs = (), ()
        self.offsets: dict[str, int] = {}
        off = 0
        for name in self.partials:
            self.offsets["q_" + name] = off
            off += align_up(self.chunks * g.S * self.acc_bytes)
        per_slot = list(self.coefs) + (["pe", "pd"] if self.backward and g.B > 1 else [])
        for name in per_slot:
            self.offsets["c_" + name] = off
            off += align_up(g.S * self.acc_bytes)
        self.scratch_bytes = off

    # helpers -----------------------------------------------------------------------------------------
    def scratch(self, params: Params, name: str) -> str:
        return params.scratch(name, self.offsets[name], self.scratch_dtype)

    def _tiles(self) -> int:
        g = self.g
        br = self.k.BR
        return -(-g.P // br) if g.channels_last else g.P * -(-g.Q // br)

    def _chunks(self) -> int:
        return -(-self._tiles() // self.k.CHUNK)

    def comps(
        self, *, p: str | None, q: str | None, c_axis: int | None, p_axis: int | None, q_axis: int | None
    ) -> list[Comp]:
        """The B (scalar bb), C (cc), P and Q components, with the tile axes they vary along."""
        g = self.g
        out = [Comp(g.b_axes, "bb", None), Comp(g.c_axes, "cc", c_axis)]
        if p is not None:
            out.append(Comp(g.p_axes, p, p_axis))
        if q is not None:
            out.append(Comp(g.q_axes, q, q_axis))
        return out

    def region(self, comps: list[Comp], masks: dict, zeros: dict | None, params: Params):
        indexer = RowIndexer(self.g.dims, comps, masks, zeros)
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
        lines = [
            f"cc = {self.pid(1)} * {bc} + tl.arange(0, {bc})" + ("[None, :]" if cl else "[:, None]"),
            f"cmask = cc < {g.C}",
        ]
        if g.b_axes:
            lines.append(f"bb = {self.pid(2)}")
        if cl:
            comps = self.comps(p="rp", q=None, c_axis=1, p_axis=0, q_axis=None)
            masks = {frozenset(): None, frozenset({0}): "pmask", frozenset({1}): "cmask", frozenset({0, 1}): "mask"}
        else:
            comps = self.comps(p="pp", q="qq", c_axis=0, p_axis=None, q_axis=1)
            masks = {frozenset(): None, frozenset({0}): "cmask", frozenset({1}): "qmask", frozenset({0, 1}): "mask"}
        return lines, comps, masks, {0: "z0", 1: "z1"}

    # launch 1: statistics -----------------------------------------------------------------------------
    def stats_kernel(self) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        br, bc, chunk = k.BR, k.BC, k.CHUNK
        acc = self.compute
        fusion = g.fusion
        nodes = fusion.prologue_for(fusion.full_inputs())
        head, comps, masks, zeros = self._tile_layout("BC")
        body = [f"pid_r = {self.pid(0)}", *head]
        cl = g.channels_last
        red_axis = 0 if cl else 1
        shape = "[BR, BC]" if cl else "[BC, BR]"
        # the shift K: x at the first element of the slot (every chunk shifts by the same K, so the
        # partial means are small numbers relative to K; the saved mean for a backward)
        if cl:
            body += [f"p_lo = pid_r * {chunk * br}", f"p_hi = tl.minimum(p_lo + {chunk * br}, {g.P})", "rp0 = 0"]
            shift_comps = self.comps(p="rp0", q=None, c_axis=1, p_axis=None, q_axis=None)
            shift_masks = {frozenset(): None, frozenset({1}): "cmask"}
        else:
            nqb = -(-g.Q // br)
            tiles = g.P * nqb
            body += [f"t_lo = pid_r * {chunk}", f"t_hi = tl.minimum(t_lo + {chunk}, {tiles})", "pp0 = 0", "qq0 = 0"]
            shift_comps = self.comps(p="pp0", q="qq0", c_axis=0, p_axis=None, q_axis=None)
            shift_masks = {frozenset(): None, frozenset({0}): "cmask"}
        em = self.region(shift_comps, shift_masks, None, params)
        if self.saved:
            shift = em.operand(self.node.input("mean"))
        else:
            shift, _ = self.full_values(em, fusion.prologue_for({self.x_uid}), grad=False)
        body += [renamed(line, "sv") for line in [*em.lines, f"K = {shift}"]]
        need_moments = not self.saved
        accs = (
            (["a0"] if self.forward else [])
            + (["a1", "a2"] if need_moments else [])
            + (["ad", "ae"] if self.backward else [])
        )
        body += [f"{a} = tl.zeros({shape}, {acc})" for a in accs]
        stages, prefetch = (k.ST or 0), bool(k.PF)
        if cl:
            current = ["rp = p0 + tl.arange(0, BR)[:, None]", "pmask = rp < p_hi", "mask = pmask & cmask"]
            header = loop_header("p0", "p_lo", "p_hi", "BR", 0 if prefetch else stages)
            # the next tile's indices, from its first row; its masks are false past the chunk's end
            walked = {"rp"}
            nxt_comps = self.comps(p="rn", q=None, c_axis=1, p_axis=0, q_axis=None)
            nxt_masks = {
                frozenset(): None,
                frozenset({0}): "pnmask",
                frozenset({1}): "cmask",
                frozenset({0, 1}): "nmask",
            }

            def nxt_index(start: str) -> list[str]:
                return [f"rn = {start} + tl.arange(0, BR)[:, None]", "pnmask = rn < p_hi", "nmask = pnmask & cmask"]

            first, following = nxt_index("p_lo"), nxt_index("p0 + BR")
        else:
            current = [
                f"pp = t // {nqb}",
                f"qq = (t % {nqb}) * BR + tl.arange(0, BR)[None, :]",
                f"qmask = qq < {g.Q}",
                "mask = cmask & qmask",
            ]
            header = loop_header("t", "t_lo", "t_hi", None, 0 if prefetch else stages)
            walked = {"pp", "qq"}
            nxt_comps = self.comps(p="pn", q="qn", c_axis=0, p_axis=None, q_axis=1)
            nxt_masks = {
                frozenset(): "nok",
                frozenset({0}): "ncmask",
                frozenset({1}): "qnmask",
                frozenset({0, 1}): "nmask",
            }

            def nxt_index(start: str) -> list[str]:
                # (bounds folded into the comparisons: `bool_tile & bool_scalar` gives int32 in the
                # interpreter, which its loads reject)
                return [
                    f"tn = {start}",
                    "nok = tn < t_hi",
                    f"pn = tn // {nqb}",
                    f"qn = (tn % {nqb}) * BR + tl.arange(0, BR)[None, :]",
                    f"qnmask = qn < tl.where(nok, {g.Q}, 0)",
                    f"ncmask = cc < tl.where(nok, {g.C}, 0)",
                    "nmask = ncmask & qnmask",
                ]

            first, following = nxt_index("t_lo"), nxt_index("t + 1")
        if prefetch:
            pf = PrefetchIndexer(g.dims, comps, masks, zeros, walked, RowIndexer(g.dims, nxt_comps, nxt_masks))
            em = make_emitter(self.piece, self.compute, pf, params)
        else:
            em = self.region(comps, masks, zeros, params)
        xv, gv = self.full_values(em, nodes)
        loop = list(current)
        loop += em.lines
        if self.forward:
            loop += [f"xr = tl.where(mask, {xv}, 0.0)", "d = tl.where(mask, xr - K, 0.0)", "a0 += xr"]
        else:
            loop.append(f"d = tl.where(mask, {xv} - K, 0.0)")
        if need_moments:
            loop += ["a1 += d", "a2 += d * d"]
        if self.backward:
            loop += [f"gr = tl.where(mask, {gv}, 0.0)", "ad += gr", "ae += gr * d"]
        before, loop = prefetched([pf] if prefetch else [], first, following, loop)
        body += before + nest(header, loop)
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
            body += ["mu = s_a1 / n", "m2 = s_a2 - s_a1 * s_a1 / n"]
            stores.update(cnt="n + tl.zeros_like(mu)", mu="mu", m2="m2", sx="s_a0")
        if self.backward:
            stores["gd"] = "s_ad"
            stores["ge"] = "s_ae" if self.saved else "s_ae - mu * s_ad"
        for name in self.partials:
            body.append(f"tl.store({self.scratch(params, 'q_' + name)} + off, {stores[name]}, mask=cmask)")
        if not self.saved:  # the first chunk's programs publish K (every chunk has the same)
            body.append(f"tl.store({self.scratch(params, 'c_k0')} + {slot}, K, mask=cmask & (cc * 0 + pid_r == 0))")
        src = params.signature("kernel_stats", ["BR", "BC"]) + "\n" + indent(body)
        cblocks = -(-g.C // bc)
        launch = Launch(
            "kernel_stats",
            (self.chunks, cblocks, g.B),
            tuple(params.args),
            (("BR", br), ("BC", bc), ("num_warps", k.W)),
        )
        return src, launch

    # launch 2: combine ----------------------------------------------------------------------------
    def combine_kernel(self) -> tuple[str, Launch]:
        """One program per BS statistic slots (slot = b * C + c): merge the chunks' partials, write the
        stats outputs and the apply pass's coefficients."""
        g, k = self.g, self.k
        params = Params()
        acc = self.compute
        tensors = self.piece.graph.tensors
        node = self.node
        bs = k.BS
        bk = max(2, min(pow2_ceil(self.chunks), max(16, 8192 // bs)))
        # per-slot tensors (stats, scale, running stats, dscale) are [1, BS] vectors
        em = self.region(
            [Comp(g.b_axes, "bb", 1), Comp(g.c_axes, "cc", 1)],
            {frozenset(): None, frozenset({1}): "smask"},
            {1: "zs"},
            params,
        )

        def take() -> list[str]:
            lines = list(em.lines)
            em.lines.clear()
            return lines

        q = {name: self.scratch(params, "q_" + name) for name in self.partials}

        def ld(name: str) -> str:
            return f"tl.load({q[name]} + ko, mask=km, other=0.0)"

        def over_chunks(lines: list[str]) -> list[str]:
            return nest(
                f"for k0 in range(0, {self.chunks}, BK):",
                ["kk = k0 + kk0", f"km = (kk < {self.chunks}) & smask", f"ko = kk * {g.S} + slot", *lines],
            )

        def zeros(*names: str) -> list[str]:
            return [f"{n} = tl.zeros([1, BS], {acc})" for n in names]

        red = "axis=0, keep_dims=True"
        body = [
            f"slot = {self.pid(0)} * BS + tl.arange(0, BS)[None, :]",
            f"smask = slot < {g.S}",
            "zs = slot * 0",
            *([f"bb = slot // {g.C}", f"cc = slot % {g.C}"] if g.b_axes else ["cc = slot"]),
            "kk0 = tl.arange(0, BK)[:, None]",
        ]
        # the per-slot inputs first: their loads are in flight with the partials'
        for role in ("mean", "inv_variance") if self.saved else ():
            em.operand(node.input(role))
        em.operand(node.input("scale"))
        if self.forward:
            em.operand(node.input("bias"))
            if node.kind == "batchnorm" and node.input("momentum") is not None:
                em.operand(node.input("in_running_mean"))
                em.operand(node.input("in_running_var"))
        body += take()
        # every chunk's partials in one [BK, BS] block (the usual case: chunks <= BK) are loaded once,
        # all at the top, and both passes of the exact merge read them from registers
        one = self.chunks <= bk and pow2_ceil(self.chunks) * bs * len(self.partials) <= 8192
        if not self.saved:
            body.append(f"kshift = tl.load({self.scratch(params, 'c_k0')} + slot, mask=smask, other=0.0)")
        if one:
            names = {"cnt": "n_i", "mu": "mu_i", "m2": "m2_i", "sx": "sx_i", "gd": "d_i", "ge": "e_i"}
            body += ["kk = kk0", f"km = (kk < {self.chunks}) & smask", f"ko = kk * {g.S} + slot"]
            body += [f"{names[p]} = {ld(p)}" for p in self.partials]
        if self.saved:
            body += zeros("t_d", "t_e")
            if one:
                body += [f"t_d += tl.sum(d_i, {red})", f"t_e += tl.sum(e_i, {red})"]
            else:
                body += over_chunks([f"t_d += tl.sum({ld('gd')}, {red})", f"t_e += tl.sum({ld('ge')}, {red})"])
            mean_v, inv_v = em.operand(node.input("mean")), em.operand(node.input("inv_variance"))
            body += take() + [f"mean = {mean_v}", f"inv = {inv_v}", "k0 = mean"]
        else:
            # exact merge of the chunks: the total mean first, then M2 about it
            body += zeros("t_n", "t_m", *(["t_s"] if self.forward else []))
            first = [f"t_n += tl.sum(n_i, {red})", f"t_m += tl.sum(n_i * mu_i, {red})"]
            loads = [f"n_i = {ld('cnt')}", f"mu_i = {ld('mu')}"]
            if self.forward:
                first.append(f"t_s += tl.sum(sx_i, {red})")
                loads.append(f"sx_i = {ld('sx')}")
            body += first if one else over_chunks([*loads, *first])
            # partial means are relative to the shift K (stored by the stats pass as k0). K + rel is
            # exact to ~eps |mean - K|, the unshifted sums' mean to ~eps |mean| (their partial sums grow
            # with the mean): the mean output takes the smaller, as |mean| < |mean - K| or not
            body += ["rel = t_m / tl.where(smask, t_n, 1.0)", "mean = kshift + rel"]
            if self.forward:
                body += [
                    "raw = t_s / tl.where(smask, t_n, 1.0)",
                    "mean = tl.where(tl.abs(raw) < tl.abs(rel), raw, mean)",
                ]
            body += zeros("t_2")
            second = ["dm = mu_i - rel", f"t_2 += tl.sum(m2_i + n_i * dm * dm, {red})"]
            if self.backward:
                body += zeros("t_d", "t_e")
                second += [f"t_d += tl.sum(d_i, {red})", f"t_e += tl.sum(e_i + dm * d_i, {red})"]
            if one:
                body += second
            else:
                loads = [f"n_i = {ld('cnt')}", f"mu_i = {ld('mu')}", f"m2_i = {ld('m2')}"]
                if self.backward:
                    loads += [f"d_i = {ld('gd')}", f"e_i = {ld('ge')}"]
                body += over_chunks(loads + second)
            eps = scalar_expr(node.input("epsilon"), tensors, params, acc)
            body += [f"inv = 1.0 / tl.sqrt(t_2 / {float(g.M)!r} + {eps})"]
        gamma = em.operand(node.input("scale"))
        body += take()
        if self.forward:
            coef = {"mu": "rel", "sc": f"{gamma} * inv", "sh": em.operand(node.input("bias"))}
            self.store_result(em, "mean", "mean")
            self.store_result(em, "inv_variance", "inv")
            if node.kind == "batchnorm" and node.input("momentum") is not None:
                mom = scalar_expr(node.input("momentum"), tensors, params, acc)
                rm, rv = em.operand(node.input("in_running_mean")), em.operand(node.input("in_running_var"))
                unbiased = f"t_2 / {float(max(g.M - 1, 1))!r}"
                body += take() + [
                    f"r_mean = (1.0 - {mom}) * {rm} + {mom} * mean",
                    f"r_var = (1.0 - {mom}) * {rv} + {mom} * {unbiased}",
                ]
                self.store_result(em, "next_running_mean", "r_mean")
                self.store_result(em, "next_running_var", "r_var")
            body += take()
        else:
            m = float(g.M)
            coef = {
                "k0": "k0",
                "mu": "rel",
                "a": f"{gamma} * inv",
                "k1": f"t_d / {m!r}",
                "k2": f"inv * inv * t_e / {m!r}",
            }
            if g.B == 1:
                self.store_result(em, "dscale", "inv * t_e")
                self.store_result(em, "dbias", "t_d")
                body += take()
            else:  # per-slot terms; launch 4 sums them over the samples
                for name, value in (("c_pe", "inv * t_e"), ("c_pd", "t_d")):
                    body.append(f"tl.store({self.scratch(params, name)} + slot, {value}, mask=smask)")
        for name in self.coefs:
            if name != "k0" or self.saved:
                body.append(f"tl.store({self.scratch(params, 'c_' + name)} + slot, {coef[name]}, mask=smask)")
        src = params.signature("kernel_combine", ["BS", "BK"]) + "\n" + indent(body)
        launch = Launch(
            "kernel_combine", (-(-g.S // bs),), tuple(params.args), (("BS", bs), ("BK", bk), ("num_warps", k.CW))
        )
        return src, launch

    def dparams_kernel(self) -> tuple[str, Launch]:
        """instancenorm backward: dscale and dbias, sums over the samples of the per-slot terms."""
        g, k = self.g, self.k
        params = Params()
        bs = k.BS
        bb = max(2, min(pow2_ceil(g.B), max(8, 4096 // bs)))
        em = self.region([Comp(g.c_axes, "cc", 1)], {frozenset(): None, frozenset({1}): "cmask"}, {1: "zc"}, params)
        body = [
            f"cc = {self.pid(0)} * BS + tl.arange(0, BS)[None, :]",
            f"cmask = cc < {g.C}",
            "zc = cc * 0",
            "bb0 = tl.arange(0, BB)[:, None]",
            f"t_ds = tl.zeros([1, BS], {self.compute})",
            f"t_db = tl.zeros([1, BS], {self.compute})",
        ]
        pe, pd = self.scratch(params, "c_pe"), self.scratch(params, "c_pd")
        body += nest(
            f"for b0 in range(0, {g.B}, BB):",
            [
                "bm = (b0 + bb0 < " + str(g.B) + ") & cmask",
                f"bo = (b0 + bb0) * {g.C} + cc",
                f"t_ds += tl.sum(tl.load({pe} + bo, mask=bm, other=0.0), axis=0, keep_dims=True)",
                f"t_db += tl.sum(tl.load({pd} + bo, mask=bm, other=0.0), axis=0, keep_dims=True)",
            ],
        )
        for role, value in (("dscale", "t_ds"), ("dbias", "t_db")):
            self.store_result(em, role, value)
        body += em.lines
        src = params.signature("kernel_dparams", ["BS", "BB"]) + "\n" + indent(body)
        launch = Launch(
            "kernel_dparams", (-(-g.C // bs),), tuple(params.args), (("BS", bs), ("BB", bb), ("num_warps", k.CW))
        )
        return src, launch

    # launch 3: apply --------------------------------------------------------------------------------
    def apply_kernel(self) -> tuple[str, Launch]:
        g, k = self.g, self.k
        params = Params()
        abr, abc = k.ABR, k.ABC
        _, comps, masks, zeros = self._tile_layout("ABC")
        cl = g.channels_last
        ncb = -(-g.C // abc)
        order = self.apply_order()
        # program i: channel block i % ncb (fastest, so a tile row's channels are read together) of
        # tile row r = i // ncb; `order` maps r to the rows of the input
        body = [f"i = {self.pid(0)}", f"cb = i % {ncb}", f"r = i // {ncb}"]
        if cl:
            row_tiles = -(-g.P // abr)
            if order:
                chr_, nch = k.CHUNK * k.BR, self.chunks
                tpc = chr_ // abr
                row_tiles = nch * tpc
                if order == 2:
                    body.append(f"r = {row_tiles - 1} - r")
                else:  # the last tile rows of every stats chunk first: what the stats pass read last
                    body += [f"r = (r % {nch}) * {tpc} + {tpc - 1} - r // {nch}"]
            body += ["rp = r * ABR + tl.arange(0, ABR)[:, None]", f"pmask = rp < {g.P}"]
            body += [
                "cc = cb * ABC + tl.arange(0, ABC)[None, :]",
                f"cmask = cc < {g.C}",
                "mask = pmask & cmask",
                "z0 = rp * 0",
                "z1 = cc * 0",
            ]
        else:
            nqb = -(-g.Q // abr)
            row_tiles = g.P * nqb
            qvalid = ""
            if order:
                ch, nch = k.CHUNK, self.chunks
                if order == 2:
                    body.append(f"r = {row_tiles - 1} - r")
                else:
                    body.append(f"r = (r % {nch}) * {ch} + {ch - 1} - r // {nch}")
                    qvalid = f" & (qq * 0 + r < {row_tiles})"
                    row_tiles = nch * ch
            body += [
                f"pp = r // {nqb}",
                f"qq = (r % {nqb}) * ABR + tl.arange(0, ABR)[None, :]",
                f"qmask = (qq < {g.Q}){qvalid}",
            ]
            body += [
                "cc = cb * ABC + tl.arange(0, ABC)[:, None]",
                f"cmask = cc < {g.C}",
                "mask = cmask & qmask",
                "z0 = cc * 0",
                "z1 = qq * 0",
            ]
        if g.b_axes:  # the stats pass walked samples last-major: the last ones are the freshest in L2
            body.append(f"bb = {g.B - 1} - {self.pid(1)}" if order else f"bb = {self.pid(1)}")
        grid = (ncb * row_tiles, g.B)
        em = self.region(comps, masks, zeros, params)
        xv, gv = self.full_values(em, g.fusion.prologue)
        node = self.node
        slot = f"bb * {g.C} + cc" if g.b_axes else "cc"
        if self.inference:
            mu, inv = em.operand(node.input("mean")), em.operand(node.input("inv_variance"))
            sc, sh = em.operand(node.input("scale")), em.operand(node.input("bias"))
            value = f"({xv} - {mu}) * {inv} * {sc} + {sh}"
        else:
            c = {
                name: f"tl.load({self.scratch(params, 'c_' + name)} + {slot}, mask=cmask, other=0.0)"
                for name in self.coefs
            }
            em.lines += [f"k_{name} = {c[name]}" for name in self.coefs]
            centered = f"(({xv} - k_k0) - k_mu)" if "mu" in self.coefs else f"({xv} - k_k0)"
            if self.forward:
                value = f"{centered} * k_sc + k_sh"
            else:
                value = f"k_a * (({gv} - k_k1) - k_k2 * {centered})"
        self.emit_output(em, value)
        body += em.lines
        src = params.signature("kernel_apply", ["ABR", "ABC"]) + "\n" + indent(body)
        launch = Launch("kernel_apply", grid, tuple(params.args), (("ABR", abr), ("ABC", abc), ("num_warps", k.AW)))
        return src, launch

    def apply_order(self) -> int:
        """The apply pass's tile order (knob ORDER): 0 in memory order; 1 the last tile rows of every
        stats chunk first, 2 the input's last rows first (both read first what the stats pass read
        last, which L2 may still hold). 1 and 2 need apply tiles that split the stats chunks."""
        order = self.k.ORDER or 0
        if self.inference or not order:
            return 0
        if self.g.channels_last:
            return order if (self.k.CHUNK * self.k.BR) % self.k.ABR == 0 else 0
        return order if self.k.ABR == self.k.BR else 0

    def generate(self) -> Generated:
        sources, launches = [], []
        if not self.inference:
            makers = [self.stats_kernel, self.combine_kernel]
            if self.backward and self.g.B > 1:
                makers.append(self.dparams_kernel)
            for make in makers:
                s, launch = make()
                sources.append(s)
                launches.append(launch)
        s, launch = self.apply_kernel()
        sources.append(s)
        launches.append(launch)
        return Generated(module_source(*sources), tuple(launches), self.scratch_bytes)


class NormStatsTemplate(NormTemplate):
    name = "norm_stats"
    priority = 30
    main_kinds = ("batchnorm", "batchnorm_inference", "batchnorm_backward", "instancenorm", "instancenorm_backward")
    knob_class = StatsKnobs

    def _geometry(self, piece: Piece) -> StatsGeometry | Support:
        fusion = analyze(piece, KINDS, self.name)
        if isinstance(fusion, Support):
            return fusion
        g = geometry(fusion)
        if g.B > 65535:
            return Support.no(f"{g.B} samples exceed the grid's third axis (65535)", fusion.norm)
        return g


class NormStatsMatch(NormMatch):
    g: StatsGeometry

    def candidates(self) -> list[StatsKnobs]:
        return candidate_knobs(self.g, self.device, stats_bytes(self.g, self.piece))

    def generate(self, knobs: StatsKnobs) -> Generated:
        return _Gen(self.piece, self.g, knobs).generate()


NormStatsTemplate.match_class = NormStatsMatch
TEMPLATE = NormStatsTemplate()
