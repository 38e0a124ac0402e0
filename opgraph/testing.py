"""Helpers to check plans against the reference engine: buffers with a tensor's exact layout,
random non-zero inputs, poisoned outputs, per-dtype tolerances and a comparison that names the
tensor and the worst element. The tests, `opgraph run` and `opgraph demo` use them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .core.dtypes import DataType
from .core.ir import FinalGraph
from .core.tensor import TensorDesc
from .memory.fill import clone, empty_like_desc, poison, random_values

# (relative, absolute) tolerance of an engine's result against the float64 reference, by output type
TOLERANCE: dict[DataType, tuple[float, float]] = {
    DataType.DOUBLE: (1e-10, 1e-12),
    DataType.FLOAT: (1e-4, 1e-5),
    DataType.HALF: (4e-3, 2e-3),
    DataType.BFLOAT16: (3e-2, 1.6e-2),
    DataType.FP8_E4M3: (1.3e-1, 6e-2),
    DataType.FP8_E5M2: (2.6e-1, 1.2e-1),
}


def inplace_uids(graph: FinalGraph) -> set[int]:
    """Outputs that their op also reads (in-place updates): their buffers hold input data."""
    return {u for n in graph.nodes for u in n.output_uids() if u in n.input_uids()}


def random_pack(graph: FinalGraph, rng: np.random.Generator, **kw: Any) -> dict[int, Any]:
    """Random inputs and poisoned outputs for every non-virtual tensor of the graph, keyed by UID.
    Pass-by-value scalars get Python floats in (0.1, 1) (integer ones ints in [1, 8)); an in-place
    tensor gets random data."""
    pack: dict[int, Any] = {}
    inplace = inplace_uids(graph)
    for uid in (*graph.inputs, *inplace):
        t = graph.tensors[uid]
        if t.is_pass_by_value:
            pack[uid] = int(rng.integers(1, 8)) if t.data_type.is_integer else float(rng.uniform(0.1, 1.0))
        else:
            pack[uid] = random_values(t, rng, **kw)
    for uid in graph.outputs:
        if uid not in inplace:
            pack[uid] = poison(empty_like_desc(graph.tensors[uid]))
    return pack


def _fan_in_operands(graph: FinalGraph) -> dict[int, float]:
    """Inputs that are weights of a matmul or convolution, and the 1/sqrt(fan-in) a user's
    initialisation would scale them by (PyTorch's default init is of that size)."""
    scales: dict[int, float] = {}
    inputs = set(graph.inputs)

    def mark(uid: object, fan_in: int) -> None:
        if isinstance(uid, int) and uid in inputs and fan_in > 0:
            scales[uid] = min(scales.get(uid, 1.0), fan_in**-0.5)

    for n in graph.nodes:
        if n.kind == "matmul":
            b = n.input("B")
            if isinstance(b, int):
                mark(b, graph.tensors[b].dim[-2])
        elif n.kind in ("conv_fprop", "conv_dgrad"):
            role = "weight" if n.kind == "conv_fprop" else "filter"
            w = n.input(role)
            if isinstance(w, int):
                dims = graph.tensors[w].dim
                fan = int(np.prod(dims[1:])) if n.kind == "conv_fprop" else dims[0] * int(np.prod(dims[2:]))
                mark(w, fan)
    return scales


def user_scaled_pack(graph: FinalGraph, rng: np.random.Generator, **kw: Any) -> dict[int, Any]:
    """`random_pack`, with the weights of matmuls and convolutions scaled by 1/sqrt(fan-in) as a
    user's initialised model has them, so that a deep graph's outputs stay of order one instead of
    growing layer by layer (what `opgraph run` feeds a graph file)."""
    pack = random_pack(graph, rng, **kw)
    for uid, factor in _fan_in_operands(graph).items():
        arr = pack[uid]
        if isinstance(arr, np.ndarray) and graph.tensors[uid].data_type.is_floating:
            arr[...] = (arr.astype(np.float64) * factor).astype(arr.dtype)
    return pack


def output_scale(want: np.ndarray) -> float:
    """The largest finite magnitude of a reference output (0 when it has none)."""
    w = np.abs(np.asarray(want, dtype=np.float64))
    w = w[np.isfinite(w)]
    return float(w.max()) if w.size else 0.0


def reference_outputs(graph: FinalGraph, pack: Mapping[int, Any]) -> dict[int, np.ndarray]:
    """Run the graph on the reference engine over copies of `pack`'s inputs; outputs by UID.
    Call it before running the plan under test: in-place tensors are read from `pack`."""
    from .runtime.plan import build_plan

    plan = build_plan(graph, device="cpu", engines=["reference"])
    ref = {u: (clone(v) if isinstance(v, np.ndarray) else v) for u, v in pack.items()}
    inplace = inplace_uids(graph)
    for uid in graph.outputs:
        if uid not in inplace:
            ref[uid] = poison(empty_like_desc(graph.tensors[uid]))
    plan.execute(ref)
    return {u: ref[u] for u in graph.outputs}


@dataclass(frozen=True)
class Mismatch:
    tensor: TensorDesc
    worst_index: tuple[int, ...]
    got: float
    want: float
    max_abs_err: float
    unwritten: int  # elements still holding the poison

    def __str__(self) -> str:
        text = (
            f"{self.tensor.label()}: max |err| {self.max_abs_err:.3g} at {list(self.worst_index)} "
            f"(got {self.got!r}, want {self.want!r})"
        )
        return text + (f"; {self.unwritten} element(s) never written" if self.unwritten else "")


def compare(
    desc: TensorDesc,
    got: np.ndarray,
    want: np.ndarray,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    relative_to_scale: bool = False,
) -> Mismatch | None:
    """None when `got` matches `want` within the type's tolerance (NaN where the reference has NaN).
    Per element: |got - want| <= atol + rtol * |want|. `relative_to_scale` also lets every element
    be off by rtol times the output's largest magnitude: what rounding in a long sum allows (an
    element near zero in a row of large products cannot be more exact than the products were)."""
    g = np.asarray(got).astype(np.float64)
    w = np.asarray(want).astype(np.float64)
    r, a = TOLERANCE.get(desc.data_type, (0.0, 0.0))
    r = r if rtol is None else rtol
    a = a if atol is None else atol
    if relative_to_scale:
        a = max(a, r * output_scale(w))
    both_nan = np.isnan(g) & np.isnan(w)
    same_inf = np.isinf(w) & (g == w)
    with np.errstate(invalid="ignore"):
        close = np.isfinite(w) & (np.abs(g - w) <= a + r * np.abs(w))  # an infinite want needs the same inf
    bad = ~(both_nan | same_inf | close)
    if not bad.any():
        return None
    err = np.where(bad, np.nan_to_num(np.abs(g - w), nan=np.inf), 0.0)
    idx = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
    unwritten = int((np.isnan(g) & ~np.isnan(w)).sum()) if desc.data_type.is_floating else 0
    return Mismatch(desc, tuple(int(i) for i in idx), float(g[idx]), float(w[idx]), float(err.max()), unwritten)


def check_plan(
    plan: Any,
    rng: np.random.Generator,
    *,
    prepare: Any = None,
    rtol: float | None = None,
    atol: float | None = None,
    **kw: Any,
) -> list[Mismatch]:
    """Run `plan` on random inputs (poisoned outputs) and compare every output with the reference
    engine. `prepare(pack)` may adjust the NumPy inputs first (e.g. positive variances). On CUDA
    the pack is copied to the device with the same strides. Returns the mismatches (empty = pass)."""
    graph = plan.graph
    pack = random_pack(graph, rng, **kw)
    if prepare is not None:
        prepare(pack)
    want = reference_outputs(graph, pack)
    if plan.device.is_cuda:
        from .core.torch_interop import pack_to_device, torch_to_numpy

        dev = pack_to_device(pack, plan.device.torch_name)
        plan.execute(dev)
        got = {u: torch_to_numpy(dev[u]) for u in graph.outputs}
    else:
        plan.execute(pack)
        got = {u: pack[u] for u in graph.outputs}
    return [
        m for u in graph.outputs if (m := compare(graph.tensors[u], got[u], want[u], rtol=rtol, atol=atol)) is not None
    ]
