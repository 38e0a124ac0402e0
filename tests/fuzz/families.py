"""The op families the fuzzer draws from: each adds a small sub-graph to a `Gen` (reading the previous
family's value where the shapes allow) and returns the value the next family may read."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

import numpy as np

import opgraph as og

from .gen import DT, FP8, WIDE_INTS, Case, Gen, V

Family = Callable[[Gen, "V | None"], "V | None"]


def pointwise(g: Gen, prev: V | None) -> V:
    space = prev.dim if prev is not None and g.chance(0.6) else g.space()
    pool = [prev] if prev is not None and prev.dim == space else []
    return g.chain(pool, space, int(g.rng.integers(1, 6)))


def cast(g: Gen, prev: V | None) -> V:
    """Casts between every pair of types on inputs full of edge values (inf, NaN, halfway cases,
    values past the target's range)."""
    src = g.pick((DT.FLOAT, DT.DOUBLE, DT.HALF, DT.BFLOAT16, *WIDE_INTS, *FP8, DT.INT8, DT.BOOLEAN))
    v = g.input(g.space(), src, profile="special")
    for _ in range(int(g.rng.integers(1, 3))):
        dst = g.pick((DT.FLOAT, DT.DOUBLE, DT.HALF, DT.BFLOAT16, *WIDE_INTS, *FP8, DT.INT8, DT.BOOLEAN))
        g.use(v)
        v = g.result(g.g.identity(v.t).set_data_type(dst), v.dim, dst, True)
    return v


def reduction(g: Gen, prev: V | None) -> V:
    x = g.source(prev, None, g.fdt() if g.chance(0.7) else g.pick(WIDE_INTS))
    g.use(x)
    mode = g.pick(list(og.ReductionMode))
    out_dim = tuple(1 if g.chance(0.6) else d for d in x.dim)
    y = g.g.reduction(x.t, mode, compute_data_type=g.cdt()).set_dim(list(out_dim))
    ints = x.dt.is_integer
    exact = x.exact and (
        mode in (og.ReductionMode.MIN, og.ReductionMode.MAX, og.ReductionMode.AMAX)
        or (ints and mode in (og.ReductionMode.ADD, og.ReductionMode.NORM1))
    )
    dt = g.pick((DT.FLOAT, DT.DOUBLE, *((x.dt,) if exact and ints else ())))
    v = g.result(y, out_dim, dt, exact)
    g.typed(v, DT.DOUBLE if g.double else dt)
    return g.epilogue(v)


def genstats(g: Gen, prev: V | None) -> V:
    x = g.floating(g.source(prev, g.pick((3, 4)), g.fdt()))
    g.use(x)
    s, sq = g.g.genstats(x.t, compute_data_type=g.cdt())
    c = (1, x.dim[1]) + (1,) * (len(x.dim) - 2)
    g.result(sq, c, DT.FLOAT, False)
    return g.result(s, c, DT.FLOAT, False)


def _eps(g: Gen):
    return g.scalar(g.scalar_type(), 1e-5, 0.1, positive=True)


def _per_channel(g: Gen, x: V) -> V:
    return g.input((1, x.dim[1]) + (1,) * (len(x.dim) - 2), g.pick((DT.FLOAT, x.dt)), allow_zero=False)


def norm(g: Gen, prev: V | None) -> V:
    kind = g.pick(("batchnorm", "batchnorm_inference", "layernorm", "rmsnorm", "instancenorm"))
    rank = g.pick((3, 4)) if kind == "instancenorm" else g.pick((2, 3, 4))
    x = g.floating(g.source(prev, rank, g.fdt(), lo=1 if kind in ("batchnorm_inference", "instancenorm") else 2))
    g.use(x)
    b = g.g
    phase = g.pick((og.NormForwardPhase.TRAINING, og.NormForwardPhase.INFERENCE))
    if kind == "batchnorm":
        scale, bias = _per_channel(g, x), _per_channel(g, x)
        running = g.chance(0.5)
        rm, rv = (_per_channel(g, x), _per_channel(g, x)) if running else (None, None)
        if running:
            g.profiles[rv.t] = "positive"
        mom = g.scalar(g.scalar_type(), 0.05, 0.5, positive=True) if running else None
        outs = b.batchnorm(
            x.t,
            scale.t,
            bias.t,
            None if rm is None else rm.t,
            None if rv is None else rv.t,
            epsilon=_eps(g),
            momentum=mom,
            compute_data_type=g.cdt(),
        )
    elif kind == "batchnorm_inference":
        mean, inv, scale, bias = (_per_channel(g, x) for _ in range(4))
        outs = [b.batchnorm_inference(x.t, mean.t, inv.t, scale.t, bias.t, compute_data_type=g.cdt())]
    elif kind in ("layernorm", "rmsnorm"):
        norm_dim = tuple(1 if a == 0 or (a < len(x.dim) - 1 and g.chance(0.3)) else d for a, d in enumerate(x.dim))
        if norm_dim == (1,) * len(x.dim):
            norm_dim = (1,) + x.dim[1:]
        scale = g.input(norm_dim, g.pick((DT.FLOAT, x.dt)), allow_zero=False)
        bias = g.input(norm_dim, scale.dt, allow_zero=False) if kind == "layernorm" or g.chance(0.3) else None
        fn = b.layernorm if kind == "layernorm" else b.rmsnorm
        outs = fn(phase, x.t, scale.t, None if bias is None else bias.t, epsilon=_eps(g), compute_data_type=g.cdt())
    else:
        scale, bias = _per_channel(g, x), _per_channel(g, x)
        outs = b.instancenorm(phase, x.t, scale.t, bias.t, epsilon=_eps(g), compute_data_type=g.cdt())
    y = g.result(outs[0], x.dim, x.dt if g.chance(0.5) else g.g.intermediate_data_type, False)
    c = (1, x.dim[1]) + (1,) * (len(x.dim) - 2)
    stats = {"batchnorm": c, "batchnorm_inference": c, "instancenorm": x.dim[:2] + (1,) * (len(x.dim) - 2)}.get(
        kind
    ) or tuple(d if s == 1 else 1 for d, s in zip(x.dim, norm_dim))
    for t in outs[1:]:
        if t is not None:
            g.result(t, stats, DT.FLOAT, False)
    return g.epilogue(y)


def norm_bwd(g: Gen, prev: V | None) -> V:
    kind = g.pick(("batchnorm_backward", "layernorm_backward", "rmsnorm_backward", "instancenorm_backward"))
    rank = g.pick((3, 4)) if kind == "instancenorm_backward" else g.pick((2, 3, 4))
    x = g.floating(g.source(prev, rank, g.fdt(), lo=2))
    dy = g.input(x.dim, g.pick((x.dt, g.fdt())))
    g.use(x)
    b = g.g
    c = (1, x.dim[1]) + (1,) * (len(x.dim) - 2)
    if kind in ("batchnorm_backward", "instancenorm_backward"):
        scale = g.input(c, DT.FLOAT, allow_zero=False)
        stats = c if kind == "batchnorm_backward" else x.dim[:2] + (1,) * (len(x.dim) - 2)
        saved = g.chance(0.6)
        mean = g.input(stats, DT.FLOAT) if saved else None
        inv = g.input(stats, DT.FLOAT, profile="positive") if saved else None
        fn = b.batchnorm_backward if kind == "batchnorm_backward" else b.instancenorm_backward
        outs = fn(
            dy.t,
            x.t,
            scale.t,
            None if mean is None else mean.t,
            None if inv is None else inv.t,
            epsilon=None if saved else _eps(g),
            compute_data_type=g.cdt(),
        )
    else:
        norm_dim = (1,) + x.dim[1:]
        stats = (x.dim[0],) + (1,) * (len(x.dim) - 1)
        scale = g.input(norm_dim, DT.FLOAT, allow_zero=False)
        inv = g.input(stats, DT.FLOAT, profile="positive")
        if kind == "layernorm_backward":
            mean = g.input(stats, DT.FLOAT)
            outs = b.layernorm_backward(dy.t, x.t, scale.t, mean.t, inv.t, compute_data_type=g.cdt())
        else:
            outs = b.rmsnorm_backward(dy.t, x.t, scale.t, inv.t, has_dbias=g.chance(0.5), compute_data_type=g.cdt())
    dx = g.result(outs[0], x.dim, g.g.intermediate_data_type, False)
    for t in outs[1:]:
        if t is not None:
            g.result(t, scale.dim, DT.FLOAT, False)
    return g.epilogue(dx)


def pool(g: Gen, prev: V | None) -> V:
    nsp = g.pick((1, 2, 2, 3))
    x = g.floating(g.source(prev, nsp + 2, g.fdt(), lo=2))
    g.use(x)
    mode = g.pick(list(og.ResampleMode))
    window = tuple(int(g.rng.integers(1, min(3, d) + 1)) for d in x.dim[2:])
    stride = tuple(int(g.rng.integers(1, 3)) for _ in window)
    pad = tuple(int(g.rng.integers(0, w)) for w in window)
    index = mode is og.ResampleMode.MAX and x.exact and g.chance(0.4)
    y, idx = g.g.resample(
        x.t,
        mode=mode,
        window=list(window),
        stride=list(stride),
        pre_padding=list(pad),
        post_padding=list(pad),
        generate_index=index,
        compute_data_type=g.cdt(),
    )
    out = tuple((d + 2 * p - w) // s + 1 for d, p, w, s in zip(x.dim[2:], pad, window, stride))
    dim = x.dim[:2] + out
    if idx is not None:
        g.typed(g.result(idx, dim, DT.INT8, True), g.pick((DT.INT8, DT.INT32))).fixed = True
    return g.epilogue(g.result(y, dim, x.dt, x.exact and mode is og.ResampleMode.MAX))


def layout(g: Gen, prev: V | None) -> V:
    x = prev if prev is not None and g.chance(0.5) else g.input(g.space(), g.pick((g.fdt(), DT.INT32, DT.HALF)))
    g.use(x)
    kind = g.pick(("transpose", "slice", "reshape", "concatenate"))
    b = g.g
    if kind == "transpose":
        perm = [int(a) for a in g.rng.permutation(len(x.dim))]
        v = g.result(b.transpose(x.t, perm), tuple(x.dim[p] for p in perm), x.dt, x.exact)
    elif kind == "slice":
        slices, dim = [], []
        for d in x.dim:
            start = int(g.rng.integers(0, d))
            stop = int(g.rng.integers(start + 1, d + 1))
            step = int(g.rng.integers(1, 3))
            slices.append(slice(start, stop, step))
            dim.append(len(range(start, stop, step)))
        v = g.result(b.slice(x.t, slices), tuple(dim), x.dt, x.exact)
    elif kind == "reshape":
        n = math.prod(x.dim)
        first = g.pick([d for d in range(1, n + 1) if n % d == 0])
        dim = (first, n // first)
        v = g.result(b.reshape(x.t, list(dim)), dim, x.dt, x.exact)
    else:
        axis = int(g.rng.integers(len(x.dim)))
        parts = [x]
        for _ in range(int(g.rng.integers(1, 3))):
            dim = tuple(int(g.rng.integers(1, 4)) if a == axis else d for a, d in enumerate(x.dim))
            parts.append(g.input(dim, x.dt))
        dim = tuple(sum(p.dim[axis] for p in parts) if a == axis else d for a, d in enumerate(x.dim))
        v = g.result(b.concatenate([p.t for p in parts], axis=axis), dim, x.dt, all(p.exact for p in parts))
    return g.epilogue(v) if g.chance(0.7) else v


def matmul(g: Gen, prev: V | None) -> V:
    ints = not g.double and g.chance(0.15)
    dt = g.pick((DT.INT8, DT.INT32)) if ints else g.fdt()
    m, k, n = (int(g.rng.integers(1, 9)) for _ in range(3))
    batch = tuple(int(g.rng.integers(1, 3)) for _ in range(int(g.rng.integers(0, 2))))
    # integer products are exact in the reference while partial sums stay below 2**53: small values
    profile = "normal" if ints else None
    a = g.input(batch + (m, k), dt, allow_zero=g.chance(0.3), profile=profile)
    bdim = tuple(1 if g.chance(0.3) else d for d in batch) + (k, n)
    bt = g.input(bdim, dt if ints or g.chance(0.7) else g.fdt(), allow_zero=g.chance(0.3), profile=profile)
    pa = g.chain([a], a.dim, 1, dt, floating=True) if not ints and g.chance(0.25) else a
    g.use(pa, bt)
    c = g.result(
        g.g.matmul(pa.t, bt.t, compute_data_type=g.cdt()),
        batch + (m, n),
        DT.INT32 if ints else g.g.intermediate_data_type,
        ints,
    )
    if ints:
        g.typed(c, g.pick(WIDE_INTS)).fixed = True
    return g.epilogue(c)


def conv(g: Gen, prev: V | None) -> V:
    kind = g.pick(("conv_fprop", "conv_fprop", "conv_dgrad", "conv_wgrad"))
    nsp = g.pick((1, 2, 2))
    dt = g.fdt()
    n, c, k = int(g.rng.integers(1, 3)), int(g.rng.integers(1, 5)), int(g.rng.integers(1, 5))
    groups = 1
    if g.chance(0.2):
        groups = c
        k = c * int(g.rng.integers(1, 3))
    xs = tuple(int(g.rng.integers(3, 7)) for _ in range(nsp))
    r = tuple(int(g.rng.integers(1, 4)) for _ in range(nsp))
    pad = tuple(int(g.rng.integers(0, 2)) for _ in range(nsp))
    stride = tuple(int(g.rng.integers(1, 3)) for _ in range(nsp))
    dil = tuple(int(g.rng.integers(1, 3)) if g.chance(0.3) else 1 for _ in range(nsp))
    ys = tuple((x + 2 * p - ((rr - 1) * d + 1)) // s + 1 for x, p, rr, d, s in zip(xs, pad, r, dil, stride))
    if min(ys) < 1:
        return pointwise(g, prev)
    xdim, wdim, ydim = (n, c) + xs, (k, c // groups) + r, (n, k) + ys
    attrs = dict(padding=list(pad), stride=list(stride), dilation=list(dil), compute_data_type=g.cdt())
    b = g.g
    if kind == "conv_fprop":
        x, w = g.input(xdim, dt, allow_zero=g.chance(0.2)), g.input(wdim, dt, allow_zero=False)
        x = g.chain([x], xdim, 1, dt, floating=True) if g.chance(0.25) else x
        g.use(x, w)
        y = g.result(b.conv_fprop(x.t, w.t, **attrs), ydim, g.g.intermediate_data_type, False)
    elif kind == "conv_dgrad":
        dy, w = g.input(ydim, dt, allow_zero=g.chance(0.2)), g.input(wdim, dt, allow_zero=False)
        g.use(dy, w)
        y = g.result(b.conv_dgrad(dy.t, w.t, **attrs).set_dim(list(xdim)), xdim, g.g.intermediate_data_type, False)
    else:
        x, dy = g.input(xdim, dt, allow_zero=g.chance(0.2)), g.input(ydim, dt, allow_zero=g.chance(0.2))
        g.use(x, dy)
        y = g.result(b.conv_wgrad(x.t, dy.t, **attrs).set_dim(list(wdim)), wdim, g.g.intermediate_data_type, False)
    return g.epilogue(y)


def inplace(g: Gen, prev: V | None) -> V | None:
    """W = W - lr * dW on W's own UID; another op may read the old W."""
    dim = g.space()
    dt = g.fdt()
    w = g.input(dim, dt, allow_zero=False)
    uid = 1_000_000 + g.n
    w.t.set_uid(uid)
    dw = g.chain([], dim, 1, dt) if g.chance(0.5) else g.input(dim, dt)
    g.use(w, dw)
    step = g.g.mul(dw.t, g.scalar(g.scalar_type(), 0.01, 0.5))
    if g.chance(0.5):  # a read of the old W besides the update
        g.result(g.g.relu(w.t), dim, g.g.intermediate_data_type, False)
    g.g.sub(w.t, step).set_uid(uid).set_output(True).set_data_type(dt).set_name(g.name("upd"))
    return None


def _extreme(family: Family) -> Family:
    """The family with extreme inputs in its draw too (see Gen.extreme): NaN, infinities, signed
    zeros and values near the type's range in its convolutions, products, sums and normalizations."""

    def run(g: Gen, prev: V | None) -> V | None:
        g.extreme = True
        try:
            return family(g, prev)
        finally:
            g.extreme = False

    run.__name__ = family.__name__
    return run


conv, norm, norm_bwd, genstats, matmul, pool = (_extreme(f) for f in (conv, norm, norm_bwd, genstats, matmul, pool))

FAMILIES: dict[str, Family] = {
    "pointwise": pointwise,
    "cast": cast,
    "reduction": reduction,
    "genstats": genstats,
    "norm": norm,
    "norm_bwd": norm_bwd,
    "pool": pool,
    "layout": layout,
    "matmul": matmul,
    "conv": conv,
    "inplace": inplace,
}
WEIGHTS = {
    "pointwise": 6,
    "cast": 3,
    "reduction": 3,
    "genstats": 1,
    "norm": 2,
    "norm_bwd": 2,
    "pool": 2,
    "layout": 2,
    "matmul": 2,
    "conv": 2,
    "inplace": 1,
}


def make_case(seed: int, families: Sequence[str] | None = None) -> Case:
    """The fuzz case of `seed`: one to three families chained (or `families`), validated."""
    rng = np.random.default_rng(seed)
    names = list(FAMILIES)
    weights = np.array([WEIGHTS[n] for n in names], dtype=float)
    last: Exception | None = None
    for _ in range(50):
        chosen = (
            list(families)
            if families
            else [names[i] for i in rng.choice(len(names), size=int(rng.integers(1, 4)), p=weights / weights.sum())]
        )
        g = Gen(int(rng.integers(2**62)))
        prev = None
        try:
            for name in chosen:
                prev = FAMILIES[name](g, prev)
            g.finish()
            final = g.g.final
        except og.GraphError as err:  # a combination the builders refuse: draw again
            last = err
            continue
        profiles = {str(t.uid): p for t, p in g.profiles.items() if t.uid in final.tensors}
        scalars = {str(t.uid): v for t, v in g.scalars.items() if t.uid in final.tensors}
        return Case(seed, json.loads(g.g.to_json()), profiles, scalars, by_reference=g.chance(0.1), families=chosen)
    raise RuntimeError(f"seed {seed}: no valid graph in 50 draws (last: {last})")
