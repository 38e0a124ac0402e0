"""What the fuzzer compares against: input values by profile, buffers with guard bytes, the reference
engine's results, and a tolerance that knows how sensitive each output is.

Sensitivity: the reference is run twice more with every inexact op's result (and the inputs of every
accumulating op) nudged by a few units in the last place of the precision an engine computes it in.
Where an output moves a lot under such nudges (cancellation, a steep function, a low-precision
intermediate crossing a rounding boundary), an engine's legitimate rounding differences move it too,
so the tolerance there is widened by that spread; everywhere else it is the output type's own.

Non-finite values (the spec: docs/concepts.md, "NaN, infinities and overflow"): where the spec allows
more than one answer (a sum that passes the compute type's range in some order only, an infinity in a
normalization's group, a padding term 0 * NaN of a convolution), those elements take NaN, 0, +-inf
and +-1 in turn in the sensitivity runs, so the spread there (and downstream) is unbounded; a NaN the
spec requires (a NaN term, inf * 0, +inf and -inf together) stays required.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

import opgraph as og
from opgraph.core.ir import Const, FinalGraph, Node
from opgraph.core.rounding import round_to
from opgraph.core.tensor import TensorDesc, storage_extent
from opgraph.ops.pointwise import Pointwise, PointwiseMode
from opgraph.testing import TOLERANCE

DT = og.DataType
M = PointwiseMode
GUARD_BYTES = 64  # guard on each side of every buffer (keeps the view 16-byte aligned)
SENTINEL = 0xA5

_EXACT_MODES = {
    M.ADD,
    M.SUB,
    M.MUL,
    M.MAX,
    M.MIN,
    M.NEG,
    M.ABS,
    M.IDENTITY,
    M.FLOOR,
    M.CEIL,
    M.CMP_EQ,
    M.CMP_NEQ,
    M.CMP_GT,
    M.CMP_GE,
    M.CMP_LT,
    M.CMP_LE,
    M.LOGICAL_AND,
    M.LOGICAL_OR,
    M.LOGICAL_NOT,
    M.BINARY_SELECT,
    M.GEN_INDEX,
    M.RELU_BWD,
    M.MOD,
}
_ACCUMULATING = {
    "reduction",
    "genstats",
    "matmul",
    "conv_fprop",
    "conv_dgrad",
    "conv_wgrad",
    "batchnorm",
    "batchnorm_backward",
    "layernorm",
    "layernorm_backward",
    "rmsnorm",
    "rmsnorm_backward",
    "instancenorm",
    "instancenorm_backward",
    "resample",
}
_WIDE = {DT.DOUBLE, DT.INT32, DT.INT64}
F32_DELTA = 2.0**-20  # ~8 units in the last place of fp32
F64_DELTA = 2.0**-49
# a product an engine may leave unrounded inside a fused multiply-add (docs/concepts.md, "Contraction"):
# about a unit in the last place of its compute type
PRODUCT_DELTA = {F32_DELTA: 2.0**-23, F64_DELTA: 2.0**-52}


# -- values ---------------------------------------------------------------------------------------------


def _special(dt: og.DataType, n: int, rng: np.random.Generator) -> np.ndarray:
    """Edge values for casts: infinities, NaN, halfway cases of every narrower type, values past
    every type's range, integers at their limits."""
    if dt is DT.BOOLEAN:
        return rng.random(n) < 0.5
    if dt.is_integer:
        info = np.iinfo(dt.numpy)
        top = min(int(info.max), 2**53)  # the reference reads integers as float64: exact up to 2**53
        pool = [
            0,
            1,
            -1,
            127,
            128,
            -129,
            255,
            256,
            2**15,
            2**24 + 1,
            2**31 - 1,
            -(2**31),
            2**31,
            2**40 + 3,
            top,
            -top,
            int(info.max),
            int(info.min),
        ]
        pool = [v for v in pool if info.min <= v <= info.max]
        return np.array([pool[i] for i in rng.integers(len(pool), size=n)], dtype=np.float64)
    pool = [
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -2.5,
        -3.5,
        1e-3,
        np.inf,
        -np.inf,
        np.nan,
        1e10,
        -1e10,
        3e9,
        -3e9,
        2.0**31,
        2.0**63,
        -(2.0**63),
        1e20,
        3.3e38,
        -3.3e38,
        65504.0,
        65520.0,
        70000.0,
        448.0,
        449.0,
        464.0,
        480.0,
        500.0,
        -1000.0,
        57344.0,
        61440.0,
        1e5,
        1 + 2.0**-8,
        1 + 3 * 2.0**-9,
        1 + 2.0**-11,
        1 + 2.0**-4,
        1 + 3 * 2.0**-5,
        1 + 2.0**-3,
        2.0**-140,
        6e-8,
        1e-300,
        127.5,
        128.5,
        -128.5,
        255.5,
    ]
    vals = np.array([pool[i] for i in rng.integers(len(pool), size=n)], dtype=np.float64)
    vals = np.where(rng.random(n) < 0.25, rng.uniform(-300, 300, size=n), vals)
    return vals


def _extreme(dt: og.DataType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    top = float(ml_dtypes.finfo(dt.numpy).max)
    v = rng.uniform(-2.0, 2.0, size=shape)
    sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    pick = rng.random(shape)
    huge = rng.random() < 0.5  # half the tensors: values whose sums or squares overflow
    v = np.where(pick < 0.1, sign * 0.0, v)
    if huge:
        v = np.where((pick >= 0.1) & (pick < 0.2), sign * top * rng.uniform(0.25, 1.0, size=shape), v)
        v = np.where((pick >= 0.2) & (pick < 0.3), sign * np.sqrt(top) * rng.uniform(0.5, 4.0, size=shape), v)
    else:
        v = np.where((pick >= 0.1) & (pick < 0.2), sign * rng.uniform(1.0, 4.0, size=shape) * 1e3, v)
    return np.where(pick > 0.97, np.nan, np.where(pick > 0.94, sign * np.inf, v))


def input_values(desc: TensorDesc, profile: str, rng: np.random.Generator) -> np.ndarray:
    """float64 (or bool) values in logical dims for one input, by the case's profile."""
    dt, shape, n = desc.data_type, desc.dim, desc.numel
    if profile.startswith("const:"):
        return np.full(shape, float(profile[6:]))
    if profile == "special":
        return _special(dt, n, rng).reshape(shape)
    if dt is DT.BOOLEAN:
        return rng.random(shape) < 0.5
    if dt.is_integer:
        info = np.iinfo(dt.numpy)
        if profile == "wide":
            span = {DT.INT32: 2**30, DT.INT64: 2**40}.get(dt, int(info.max))
            return rng.integers(max(info.min, -span), span, size=shape).astype(np.float64)
        lo = 1 if dt is DT.UINT8 else -8
        v = rng.integers(lo, 8, size=shape)
        return np.where(v == 0, 1, v).astype(np.float64)
    if profile == "positive":
        return rng.uniform(0.1, 2.0, size=shape)
    if profile == "tiny":  # where textbook formulas lose relative accuracy (tanh, expm1, log1p)
        return rng.uniform(-1.0, 1.0, size=shape) * 10.0 ** rng.uniform(-9, -3, size=shape)
    if profile == "nonfinite":  # NaN and infinities among normal values: every op must propagate them
        v = rng.uniform(-2.0, 2.0, size=shape)
        pick = rng.random(shape)
        return np.where(pick < 0.1, np.nan, np.where(pick < 0.15, np.inf, np.where(pick < 0.2, -np.inf, v)))
    if profile == "extreme":  # near the type's range (and sqrt of it: squares overflow), signed zeros, inf, NaN
        return _extreme(dt, shape, rng)
    if profile == "large":
        return rng.uniform(-1.0, 1.0, size=shape) * 10.0 ** rng.uniform(1, 4, size=shape)
    v = rng.uniform(-2.0, 2.0, size=shape)
    return np.where(np.abs(v) < 1e-3, 0.5, v)


# -- buffers ----------------------------------------------------------------------------------------------


@dataclass
class Buffer:
    """One bound tensor: a base allocation (guard, storage, guard) filled with a sentinel, the strided
    view the plan gets, and which base elements belong to the tensor."""

    desc: TensorDesc
    base: Any  # numpy array (CPU) or torch tensor (CUDA), 1-D
    view: Any
    owned: np.ndarray  # bool per base element: True where the tensor has an element

    def host(self) -> np.ndarray:
        """The view's values as a host NumPy array of the tensor's type."""
        if isinstance(self.view, np.ndarray):
            return self.view
        from opgraph.core.torch_interop import torch_to_numpy

        return torch_to_numpy(self.view)

    def base_bytes(self) -> np.ndarray:
        if isinstance(self.base, np.ndarray):
            return self.base.view(np.uint8).copy()
        import torch

        return self.base.view(torch.uint8).cpu().numpy().copy()


def _offsets(desc: TensorDesc) -> np.ndarray:
    idx = np.zeros((), dtype=np.int64)
    for d, s in zip(desc.dim, desc.stride):
        idx = idx[..., None] + np.arange(d, dtype=np.int64) * s
    return idx.reshape(desc.dim)


def make_buffer(desc: TensorDesc, values: np.ndarray | None, device: str) -> Buffer:
    """A buffer holding `values` (rounded to the tensor's type), or poison (NaN, the integer max,
    True) when `values` is None."""
    extent = max(storage_extent(desc.dim, desc.stride), 1)
    npdt = desc.data_type.numpy
    guard = GUARD_BYTES // npdt.itemsize
    raw = np.full((extent + 2 * guard) * npdt.itemsize + 64, SENTINEL, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    base = raw[start : start + (extent + 2 * guard) * npdt.itemsize].view(npdt)
    offsets = _offsets(desc) + guard
    owned = np.zeros(base.size, dtype=bool)
    owned[offsets.reshape(-1)] = True
    if values is None:
        dt = desc.data_type
        fill = True if dt is DT.BOOLEAN else np.iinfo(npdt).max if dt.is_integer else np.nan
        logical = (
            np.full(desc.dim, fill).astype(npdt)
            if dt.is_integer or dt is DT.BOOLEAN
            else np.full(desc.dim, np.nan).astype(npdt)
        )
    else:
        logical = round_to(np.asarray(values), desc.data_type)
    base[offsets] = logical
    strides = [s * npdt.itemsize for s in desc.stride]
    if device == "cpu":
        from opgraph.core.tensor import strided_view

        view = strided_view(base[guard:], desc.dim, desc.stride)
        return Buffer(desc, base, view, owned)
    import torch

    from opgraph.core.torch_interop import numpy_to_torch

    tbase = numpy_to_torch(base, device)
    view = torch.as_strided(tbase, desc.dim, desc.stride, guard)
    del strides
    return Buffer(desc, tbase, view, owned)


# -- the reference and its sensitivity ------------------------------------------------------------------


def exact_node(node: Node, tensors: Mapping[int, TensorDesc]) -> bool:
    """Whether every engine computes this node's results bit for bit as the reference does (given
    bit-equal operands)."""
    op = node.op
    ins = [tensors[u] for u in node.input_uids()]
    if isinstance(op, Pointwise):
        if op.mode is M.RELU_FWD:  # lower + slope * (x - lower): exact when it is a clip
            return all(isinstance(v, Const) and v.value == 0 for v in node.inputs[3:4]) or node.inputs[3] is None
        return op.mode in _EXACT_MODES
    if getattr(op, "MOVES_DATA_ONLY", False):
        return True
    if node.kind == "reduction" and op.mode.name in ("MIN", "MAX", "AMAX"):
        return True
    if node.kind == "resample" and op.mode.name == "MAX":
        return True
    if node.kind in _ACCUMULATING and all(not t.data_type.is_floating for t in ins):
        # integer sums are exact in every engine's wide accumulator; a mean's division and a norm's
        # square root round (sum / n or sum * (1 / n): a last bit that sin(3e6) turns into 2e-9)
        return not (node.kind == "reduction" and op.mode.name in ("AVG", "NORM2"))
    return False


_PERIODIC = {M.SIN, M.COS, M.TAN}


def _periodic_noise(node: Node, ins: list[Any], unnudged: np.ndarray, d: float, hot: list[Any]) -> list[Any]:
    """sin, cos or tan of an argument whose uncertainty spans a good part of the period: so large that
    the few units in its last place an engine's arithmetic leaves exceed pi (|x| * 64 * delta >= pi),
    or moved by this run's nudges upstream by more than pi / 8 (a TF32 weight gradient of 2544.7 is
    off by ~1.5): any value of the function's range is right there (tan(-7.1e39) is 0.54 in one
    order of a normalization's sums and -253 in another: fuzz seeds 20261126200986, 20261126207128);
    16 nudged runs sample tan's heavy tails too seldom to say so."""
    if not (isinstance(node.op, Pointwise) and node.op.mode in _PERIODIC) or not isinstance(ins[0], np.ndarray):
        return hot
    x, was = ins[0], np.asarray(unnudged, dtype=np.float64)
    with np.errstate(all="ignore"):
        wild = np.broadcast_to((np.abs(x) * 64 * d >= np.pi) | (np.abs(x - was) >= np.pi / 8), np.shape(x))
    if not wild.any():
        return hot
    return [wild if h is None else (h | wild) for h in hot[:1]] + hot[1:]


_F32_TINY = float(np.finfo(np.float32).tiny)


def _flushed(
    node: Node, ins: list[Any], results: list[Any], tensors: Mapping[int, TensorDesc], hot: list[Any]
) -> list[Any]:
    """Where an fp32 inexact function's result may differ by a flush to zero (docs/concepts.md): where
    its subnormal operands, read as signed zeros (Triton's libdevice flushes them: sqrt(1e-45) is 0
    there), give another result; and where the result is below a few times the smallest normal, scaled
    by its operands' magnitude up to 2**20 (an inner exponential flushed: x * sech(x)**2 at x = -44 is
    -1e-36 exactly and -0.0 with exp(-88) flushed; a square root of -2e-41 is NaN and of -0.0 is -0.0:
    fuzz seed 20261126207165). What reads such an element follows either."""
    if not isinstance(node.op, Pointwise) or node_delta(node, tensors) != F32_DELTA or exact_node(node, tensors):
        return hot
    descs = [None if u is None else tensors[u] for u in node.outputs]
    with np.errstate(all="ignore"):
        scale = np.ones(())
        zeroed, any_sub = [], False
        for a in ins:
            if a is None:
                zeroed.append(a)
                continue
            v = np.asarray(a, dtype=np.float64)
            m = np.abs(np.nan_to_num(v, posinf=0, neginf=0))
            scale = np.maximum(scale, np.minimum(m, 2.0**20))
            sub = (m > 0) & (m < _F32_TINY)
            any_sub = any_sub or bool(sub.any())
            zeroed.append(np.where(sub, np.copysign(0.0, v), v) if np.ndim(v) else (np.copysign(0.0, v) if sub else v))
        alt = node.op.reference(zeroed, descs) if any_sub else [None] * len(results)
    out = []
    for h, r, r0 in zip(hot, results, alt):
        if r is None:
            out.append(h)
            continue
        with np.errstate(all="ignore"):
            r = np.asarray(r, dtype=np.float64)
            a = np.abs(r)
            tiny = (a > 0) & (a < 4 * _F32_TINY * scale)
            if r0 is not None:
                r0 = np.broadcast_to(np.asarray(r0, dtype=np.float64), r.shape)
                tiny = tiny | ((r0 != r) & ~(np.isnan(r0) & np.isnan(r)))
        out.append(h if not tiny.any() else tiny if h is None else (h | tiny))
    return out


def _big_integer_sum(node: Node, env: Mapping[int, np.ndarray], tensors: Mapping[int, TensorDesc]) -> bool:
    """An integer sum (exact by `exact_node`) whose terms' magnitudes pass what its accumulator holds
    exactly: 2**24 in an fp32 compute type, 2**53 in float64 (and int64's wrap beyond): the order of
    the sum decides the answer (2**63 - 2**63 + 1 is 1 or 0, fuzz seed 20261126110946)."""
    if node.kind not in _ACCUMULATING or not exact_node(node, tensors):
        return False
    if any(tensors[u].data_type.is_floating for u in node.input_uids()) or getattr(
        getattr(node.op, "mode", None), "name", ""
    ) in ("MIN", "MAX", "AMAX"):
        return False  # (a float max / min is exact in any order)
    ins = [
        None if v is None or isinstance(v, Const) else np.abs(np.asarray(env[v], dtype=np.float64)) for v in node.inputs
    ]
    limit = 2.0**53 if node.compute_data_type is DT.DOUBLE else 2.0**24
    with np.errstate(all="ignore"):
        size = node.op.reference(ins, [None if u is None else tensors[u] for u in node.outputs])
    return any(m is not None and bool(np.any(np.asarray(m, dtype=np.float64) >= limit)) for m in size)


def _double_rounded(node: Node, desc: TensorDesc, tensors: Mapping[int, TensorDesc]) -> bool:
    """An exact pointwise result stored narrower than its fp32 compute type: an engine rounds it to
    fp32, then to the output type, and the two roundings differ from one at a tie of the narrow type
    (f16(f32(a - b)) against f16(a - b), fuzz seed 20261126106267) or, for an integer type, next to an
    integer (int8(f32(-128 + 8.9e-7)) is -128, int8(-127.9999991) is -127: fuzz seed 20261129811134)."""
    return (
        isinstance(node.op, Pointwise)
        and exact_node(node, tensors)
        and desc.data_type not in (DT.FLOAT, DT.DOUBLE)
        and node_delta(node, tensors) == F32_DELTA
        and node.compute_data_type is not DT.DOUBLE
    )


def contractible(node: Node, tensors: Mapping[int, TensorDesc]) -> bool:
    """A floating product: an engine may fuse it into a sum that reads it (and store it rounded too).
    A normalization's main result ends in a product too (dx = scale * invstd * (...), y = xhat * scale;
    its first output: its statistics, dscale and dbias are sums and roots)."""
    product = (isinstance(node.op, Pointwise) and node.op.mode is M.MUL) or node.kind in _NORMS
    return product and all(tensors[u].data_type.is_floating for u in node.output_uids())


def node_delta(node: Node, tensors: Mapping[int, TensorDesc]) -> float:
    wide = node.compute_data_type is DT.DOUBLE or any(
        tensors[u].data_type in _WIDE for u in (*node.input_uids(), *node.output_uids())
    )
    return F64_DELTA if wide else F32_DELTA


_LINEAR = {"matmul", "conv_fprop", "conv_dgrad", "conv_wgrad", "genstats", "resample", "reduction"}
_NORMS = {
    "batchnorm",
    "batchnorm_inference",
    "batchnorm_backward",
    "layernorm",
    "layernorm_backward",
    "rmsnorm",
    "rmsnorm_backward",
    "instancenorm",
    "instancenorm_backward",
}


def padding_terms(node: Node, ins: list[Any], descs: list[Any]) -> np.ndarray | None:
    """Convolutions: the output elements with a term 0 * v, v NaN or infinite, where the 0 is no
    element of the data (fprop, wgrad: a padding position of X meeting a filter tap or DY element;
    dgrad: a tap meeting no DY element at a DX pixel, a border or a stride hole). An engine may compute
    such a term (IEEE: NaN) or leave it out (the spec: docs/concepts.md), so these elements may be
    either; None where there are none."""
    from opgraph.ops.conv_math import conv_data_grad, conv_forward, conv_weight_grad

    kind, op = node.kind, node.op
    if kind not in ("conv_fprop", "conv_dgrad", "conv_wgrad") or descs[0] is None:
        return None
    a, b = (np.asarray(v, dtype=np.float64) for v in ins[:2])
    bad = lambda v: (~np.isfinite(v)).astype(np.float64)  # noqa: E731
    geo = op.geometry(a.ndim - 2)
    mode = op.convolution_mode
    with np.errstate(all="ignore"):
        if kind == "conv_dgrad":  # each tap meets each DX pixel once in the zero-stuffed form
            real = conv_data_grad(np.ones_like(a), bad(b), descs[0].dim, geo, mode)
            per = bad(b).reshape(b.shape[0], b.shape[1], -1).sum(axis=2)  # [K, C/G]
            groups = descs[0].dim[1] // b.shape[1]
            total = per.reshape(groups, -1, b.shape[1]).sum(axis=1).reshape(1, -1)  # [1, C]
            total = total.reshape(total.shape + (1,) * (len(descs[0].dim) - 2))
            hot = total > real
        else:
            bare = type(geo)((0,) * len(geo.pre), (0,) * len(geo.post), geo.stride, geo.dilation)
            pads = [(0, 0), (0, 0), *zip(geo.pre, geo.post)]
            marker = np.pad(np.zeros_like(a), pads, constant_values=1.0)  # 1 at padding positions only
            if kind == "conv_fprop":
                hot = conv_forward(marker, bad(b), bare, mode) > 0
            else:
                hot = conv_weight_grad(marker, bad(b), descs[0].dim, bare, mode) > 0
    hot = np.broadcast_to(hot, descs[0].dim) | _group_terms(kind, op, a, b, descs[0].dim, geo, mode)
    return hot if hot.any() else None


def _group_terms(
    kind: str, op: Any, a: np.ndarray, b: np.ndarray, out_dim: Sequence[int], geo: Any, mode: Any
) -> np.ndarray:
    """Grouped convolutions computed as dense ones whose filter is 0 between groups (cuDNN's data
    gradient does, through PyTorch, on an H100: fuzz seed 20261125503297): a product of such a 0 with a
    NaN or infinite input of another group (fprop: X; dgrad: DY) is a `0 * v` term as a padding one.
    Wgrad's dense product is cropped to the groups and has none."""
    from opgraph.ops.conv_math import conv_data_grad, conv_forward

    groups = (out_dim[1] // b.shape[1]) if kind == "conv_dgrad" else (a.shape[1] // b.shape[1])
    if groups == 1 or kind == "conv_wgrad":
        return np.zeros(out_dim, dtype=bool)
    bad = (~np.isfinite(a)).astype(np.float64)
    with np.errstate(all="ignore"):
        if kind == "conv_fprop":  # a dense filter [K, C, taps] of ones: every channel meets every output
            dense = np.ones((b.shape[0], a.shape[1], *b.shape[2:]))
            return conv_forward(bad, dense, geo, mode) > 0
        dense = np.ones((a.shape[1], out_dim[1], *b.shape[2:]))
        return conv_data_grad(bad, dense, out_dim, geo, mode) > 0


def _norm_axes(node: Node, ins: list[Any]) -> tuple[np.ndarray, tuple[int, ...]]:
    """A normalization's largest operand and the axes it normalizes over (its groups)."""
    x = max((a for a in ins if isinstance(a, np.ndarray)), key=lambda a: a.size)
    rank, kind = x.ndim, node.kind
    if kind.startswith("batchnorm") and kind != "batchnorm_inference":
        return x, (0, *range(2, rank))
    if kind.startswith("instancenorm"):
        return x, tuple(range(2, rank))
    if kind.startswith(("layernorm", "rmsnorm")):
        scale = ins[list(node.op.INPUTS).index("scale")]
        return x, () if scale is None else tuple(a for a in range(rank) if np.shape(scale)[a] == x.shape[a] > 1)
    return x, ()  # batchnorm_inference: per element


_CENTERED_BACKWARD = {"batchnorm_backward", "instancenorm_backward", "layernorm_backward"}


def _zero_noise_dx(node: Node, stored: list[Any], dx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """dx of a mean-subtracting normalization where grad * scale is constant over a group is 0 in exact
    arithmetic (g - mean(g) and mean(g * xhat) vanish): what an engine computes there is rounding noise,
    exactly 0 in one formula, 1e-19 or 1e-8 in another (a reciprocal of it is inf or 1e17: fuzz seed
    20261128005172), of either sign (a square root of it is NaN: seed 20261125503308 on an H100).
    In a third of the nudged runs each, those groups' dx become exactly 0, the noise's magnitude, or
    its negative: with 16 runs every element sees all three (`stored`: the inputs as stored, before
    the sensitivity runs' nudges)."""
    names = list(node.op.INPUTS)
    grad, scale = stored[names.index("grad")], stored[names.index("scale")]
    if not isinstance(grad, np.ndarray):
        return dx
    pick = rng.uniform()
    x, axes = _norm_axes(node, stored)
    if not axes:
        return dx
    with np.errstate(all="ignore"):
        gs = np.broadcast_to(grad * (1.0 if scale is None else scale), x.shape)
        flat = gs.max(axis=axes, keepdims=True) == gs.min(axis=axes, keepdims=True)
        noise = 0.0 if pick < 1 / 3 else np.abs(dx) if pick < 2 / 3 else -np.abs(dx)
    return np.where(np.broadcast_to(flat, dx.shape), noise, dx)


def _norm_groups(node: Node, ins: list[Any], descs: list[Any], limit: float) -> list[np.ndarray | None]:
    """A normalization's outputs that read an infinity, or a value whose cube (times the element
    count) reaches the range: an element's own inputs and its group's (the normalized axes A)."""
    x, axes = _norm_axes(node, ins)
    rank = x.ndim
    thr = (limit / (4.0 * x.size)) ** (1.0 / 3.0)
    bad = np.zeros(x.shape, dtype=bool)
    for a in ins:
        if isinstance(a, np.ndarray) and a.size:
            bad |= np.broadcast_to(np.isinf(a) | (np.abs(np.nan_to_num(a)) >= thr), x.shape)
    if axes:
        bad = np.broadcast_to(bad.any(axis=axes, keepdims=True), x.shape)
    out: list[np.ndarray | None] = []
    for d in descs:
        if d is None:
            out.append(None)
            continue
        reduce = tuple(a for a in range(rank) if d.dim[a] == 1 and x.shape[a] > 1)
        out.append(bad.any(axis=reduce, keepdims=True) if reduce else bad)
    return out


def order_sensitive(node: Node, ins: list[Any], descs: list[Any]) -> list[np.ndarray | None]:
    """Per output of an accumulating node: where the result depends on the order (or formula) of its
    sums because an intermediate can pass the compute type's range in some valid order (the spec:
    docs/concepts.md, "NaN, infinities and overflow"), so any answer is allowed. Elements whose result
    is NaN in every order (a NaN in the receptive field or row, inf * 0, +inf and -inf among the
    terms) are not: they must be NaN.

    Linear ops (matmul, conv, sums, average pooling, genstats): the sum of the terms' magnitudes
    (the op over |inputs|, non-finite values as 0) near the range. Normalizations: the largest finite
    input whose cube (a product of three factors), times the element count, reaches the range."""
    kind = node.kind
    if kind not in _LINEAR and kind not in _NORMS:
        return [None] * len(descs)
    limit = float(np.finfo(np.float64 if node.compute_data_type is DT.DOUBLE else np.float32).max)
    arrays = [a for a in ins if isinstance(a, np.ndarray) and a.ndim > 0]
    if not arrays:
        return [None] * len(descs)

    def fix(f: Callable[[np.ndarray], np.ndarray]) -> list[Any]:
        return [f(a) if isinstance(a, np.ndarray) and a.ndim > 0 else a for a in ins]

    with np.errstate(all="ignore"):
        # NaN in every order: the op over the inputs with finite values clipped to magnitude <= 1
        forced = node.op.reference(fix(lambda a: np.where(np.isfinite(a), np.clip(a, -1.0, 1.0), a)), descs)
        if kind in _LINEAR:
            if kind == "reduction" and node.op.mode.name == "MUL":
                size = node.op.reference(
                    fix(lambda a: np.maximum(np.abs(np.nan_to_num(a, posinf=0, neginf=0)), 1.0)), descs
                )
            else:
                size = node.op.reference(fix(lambda a: np.abs(np.nan_to_num(a, posinf=0, neginf=0))), descs)
            hot = [None if m is None else np.asarray(m, dtype=np.float64) >= limit / 128 for m in size]
        else:  # an infinity anywhere: the formula's order decides (inf - inf or inf); NaN inputs stay NaN
            forced = node.op.reference(fix(lambda a: np.where(np.isnan(a), a, np.clip(np.nan_to_num(a), -1, 1))), descs)
            hot = _norm_groups(node, ins, descs, limit)
    pad = padding_terms(node, ins, descs)
    if pad is not None and hot[0] is None:
        hot[0] = np.zeros(pad.shape, dtype=bool)
    out: list[np.ndarray | None] = []
    for i, (h, f, d) in enumerate(zip(hot, forced, descs)):
        if h is None or d is None or f is None or not d.data_type.is_floating:
            out.append(None)
            continue
        h = np.broadcast_to(h, d.dim) & ~np.isnan(np.broadcast_to(np.asarray(f, dtype=np.float64), d.dim))
        if i == 0 and pad is not None:  # (a padding term may be all that makes an element NaN)
            h = h | pad
        out.append(h if h.any() else None)
    return out


def evaluate(
    graph: FinalGraph,
    inputs: Mapping[int, Any],
    rng: np.random.Generator | None,
    delta: Callable[[Node], float] | None = None,
    low: bool = False,
    wild: float | None = None,
    base: Mapping[int, np.ndarray] | None = None,
) -> dict[int, np.ndarray]:
    """The reference semantics over `inputs` (float64 arrays / numbers by UID); with `rng`, inexact
    results (and accumulating ops' floating inputs) nudged by +-delta(node) relative; with `low`, each
    op that an engine computes in fp32 evaluated by its reference formula in float32 (what the
    formula itself loses in fp32: 1 - tanh(x)**2 for large x, a sum's order). In those runs the
    order-sensitive elements of accumulating ops (`order_sensitive`) are set to `wild` (NaN when
    None): any answer goes there, and downstream of them. `base`: every tensor's unnudged value (the
    reference run's), against which a nudged run sees how far its nudges moved an operand."""
    env: dict[int, np.ndarray] = {}
    for uid, v in inputs.items():
        env[uid] = np.full(graph.tensors[uid].dim, float(v)) if not isinstance(v, np.ndarray) else v
    tensors = graph.tensors

    def nudge(a: np.ndarray, d: float) -> np.ndarray:
        return a * (1.0 + d * rng.uniform(-1.0, 1.0, size=np.shape(a)))

    out: dict[int, np.ndarray] = {}
    # products as a sum that reads them may see them (`contractible`): each such reader draws its own
    # rounding, (dx + y) - dx fused twice is y plus two different last bits of dx
    contracted: dict[int, tuple[np.ndarray, float]] = {}
    for node in graph.nodes:
        exact = rng is None or exact_node(node, tensors)
        big = rng is not None and exact and _big_integer_sum(node, env, tensors)
        exact = exact and not big
        # an exact op that is no sum (a compare, floor, a select...) gets the stored, rounded product
        fma = not exact or (isinstance(node.op, Pointwise) and node.op.mode in (M.ADD, M.SUB))
        d = 0.0 if rng is None else (delta(node) if delta else node_delta(node, tensors))
        narrow = low and not exact_node(node, tensors) and node_delta(node, tensors) == F32_DELTA
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(None)
            elif isinstance(v, Const):
                ins.append(np.asarray(float(v.value), dtype=np.float32 if narrow else np.float64))
            else:
                if fma and v in contracted:
                    with np.errstate(all="ignore"):
                        a = round_to(nudge(*contracted[v]), tensors[v].data_type).astype(np.float64)
                else:
                    a = env[v].astype(np.float64)
                if not exact and node.kind in _ACCUMULATING and (tensors[v].data_type.is_floating or big):
                    a = nudge(a, 4 * (F32_DELTA if big and node.compute_data_type is not DT.DOUBLE else d))
                ins.append(a.astype(np.float32) if narrow else a)
        descs = [None if u is None else tensors[u] for u in node.outputs]
        with np.errstate(all="ignore"):
            results = node.op.reference(ins, descs)
        stored = [
            None
            if v is None
            else np.asarray(env[v], dtype=np.float64)
            if not isinstance(v, Const)
            else np.asarray(float(v.value))
            for v in node.inputs
        ]  # the inputs before any nudge
        if rng is not None and node.kind in _CENTERED_BACKWARD and results[0] is not None:
            results = [_zero_noise_dx(node, stored, np.asarray(results[0], dtype=np.float64), rng), *results[1:]]
        sensitive = (rng is not None or low) and not exact_node(node, tensors)
        hot = order_sensitive(node, stored, descs) if sensitive else [None] * len(descs)
        if sensitive and rng is not None:
            if base is not None and node.inputs and isinstance(node.inputs[0], int) and node.inputs[0] in base:
                hot = _periodic_noise(node, stored, base[node.inputs[0]], d, hot)
            hot = _flushed(node, stored, results, tensors, hot)
        for uid, desc, r, h in zip(node.outputs, descs, results, hot):
            if uid is None or r is None:
                continue
            r = np.asarray(r, dtype=np.float64)
            if not exact:
                with np.errstate(all="ignore"):
                    r = nudge(r, d)
            if h is not None:
                r = np.where(h, np.nan if wild is None else wild, r)
            if (rng is not None or low) and _double_rounded(node, desc, tensors):
                r = round_to(r, DT.FLOAT).astype(np.float64)
            env[uid] = round_to(r, desc.data_type)
            out[uid] = env[uid]
            if rng is not None and uid == node.outputs[0] and contractible(node, tensors):  # what a sum may see
                contracted[uid] = (r, PRODUCT_DELTA[node_delta(node, tensors)])
    return out


@dataclass
class Mismatch:
    uid: int
    label: str
    index: tuple[int, ...]
    got: float
    want: float
    allowed: float

    def __str__(self) -> str:
        return (
            f"{self.label}: at {list(self.index)} got {self.got!r}, want {self.want!r} "
            f"(|err| {abs(self.got - self.want):.3g} > allowed {self.allowed:.3g})"
        )


def compare(
    desc: TensorDesc, got: np.ndarray, want: np.ndarray, spread: np.ndarray, loosest: og.DataType | None = None
) -> Mismatch | None:
    """None when got matches want within the output type's tolerance plus 4x the spread (NaN where
    want is NaN, the same infinity where want is infinite)."""
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    # relative tolerance of the type; no absolute slack beyond its smallest normal (results near 0
    # must be right relative to their size: tanh(1e-7)), except what a narrower intermediate type
    # on the way costs, and the spread where cancellation makes the output sensitive
    rtol, _ = TOLERANCE.get(desc.data_type, (0.0, 0.0))
    atol = float(ml_dtypes.finfo(desc.data_type.numpy).tiny) if desc.data_type.is_floating else 0.0
    if loosest is not None and desc.data_type.is_floating:
        lr, la = TOLERANCE.get(loosest, (0.0, 0.0))
        rtol, atol = max(rtol, lr), max(atol, la)
    with np.errstate(invalid="ignore", over="ignore"):
        slack = 4.0 * np.nan_to_num(np.broadcast_to(spread, w.shape), nan=np.inf, posinf=np.inf)
        allowed = atol + rtol * np.where(np.isfinite(w), np.abs(w), 0.0) + slack
        ok = (np.isnan(g) & np.isnan(w)) | (g == w) | (np.isfinite(w) & (np.abs(g - w) <= allowed))
        ok |= np.isinf(slack)  # an output a last bit upstream can turn into NaN or inf: not comparable
    if ok.all():
        return None
    bad = np.argwhere(~ok)[0]
    idx = tuple(int(i) for i in bad)
    return Mismatch(desc.uid, desc.label(), idx, float(g[idx]), float(w[idx]), float(allowed[idx]))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two results are equal element for element (NaN equal to NaN)."""
    a64, b64 = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    return bool(np.all((a64 == b64) | (np.isnan(a64) & np.isnan(b64))))


_ = ml_dtypes


def refill(buf: Buffer, values: np.ndarray | None) -> None:
    """Put `values` (or poison) back into a buffer's elements, leaving its guards and gaps as they are."""
    fresh = make_buffer(buf.desc, values, "cpu")
    if isinstance(buf.base, np.ndarray):
        buf.base[fresh.owned] = fresh.base[fresh.owned]
        return
    import torch

    owned = torch.from_numpy(fresh.owned).to(buf.base.device)
    src = make_buffer(buf.desc, values, str(buf.base.device)).base
    buf.base[owned] = src[owned]
