"""What every op mapping of the torch engine shares: the registry of mappings, the view of one node
that a mapping gets (`Call`), buffer conversion and the reference engine's rounding, in torch.

Numerics (the reference semantics, see opgraph/rounding.py): a node computes in float32, or in
float64 when its compute type or any of its tensors is DOUBLE, INT32 or INT64 (so integer values
stay exact, as in the float64 reference); every output is rounded to its declared type
(`round_to`), intermediates included, so that an fp16 intermediate is fp16 here as everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ...core.dtypes import DataType
from ...core.errors import ExecutionError, expect
from ...core.ir import Const, Node
from ...core.registry import Registry
from ...core.tensor import TensorDesc
from ...core.torch_interop import as_torch  # noqa: F401 (the engine's mappings read buffers through it)

if TYPE_CHECKING:
    import torch

# kind -> mapping. A mapping takes a `Call` and returns one torch tensor (or None) per output role,
# in any dtype and any dims that broadcast to the output's (rounding and broadcasting follow).
OpMapping = Callable[["Call"], Sequence[Any]]
IMPLS: Registry[str, OpMapping] = Registry("torch mapping")

_WIDE = frozenset({DataType.DOUBLE, DataType.INT32, DataType.INT64})
_E4M3_MAX = 448.0


def implements(*kinds: str) -> Callable[[OpMapping], OpMapping]:
    """Decorator: register a mapping for op kinds."""

    def register(fn: OpMapping) -> OpMapping:
        for kind in kinds:
            IMPLS.register(kind, fn)
        return fn

    return register


def node_descs(node: Node, tensors: Mapping[int, TensorDesc]) -> list[TensorDesc]:
    return [tensors[u] for u in (*node.input_uids(), *node.output_uids())]


def wide_compute(node: Node, tensors: Mapping[int, TensorDesc]) -> bool:
    """Whether `node` computes in float64 (see the module docstring)."""
    return node.compute_data_type is DataType.DOUBLE or any(d.data_type in _WIDE for d in node_descs(node, tensors))


def to_numpy_f64(t: Any) -> np.ndarray:
    """A torch tensor (any dtype, any device) or number as a float64 host array."""
    import torch

    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(float(t), dtype=np.float64)


def round_to(t: torch.Tensor, dt: DataType) -> torch.Tensor:
    """`t` in declared type `dt`, rounded as opgraph.rounding.round_to does: floats to nearest even
    (fp8 E4M3 saturating to +-448), integers toward zero with saturation and NaN -> 0, booleans as
    value != 0."""
    import torch

    target = dt.to_torch()
    if t.dtype == target:
        return t
    if dt is DataType.BOOLEAN:
        return t != 0
    if dt.is_integer:
        info = np.iinfo(dt.numpy)
        r = torch.nan_to_num(t.to(torch.float64), nan=0.0).trunc()  # toward zero, as t.to(torch.long)
        out = r.clamp(float(info.min), float(info.max)).to(target)
        if dt is DataType.INT64:  # float(INT64 max) is 2**63, which does not cast back
            out = torch.where(r >= 2.0**63, torch.full_like(out, info.max), out)
        return out
    if t.dtype == torch.bool or (t.is_floating_point() and t.element_size() == 1):
        t = t.to(torch.float32)  # (exact; CUDA has no clamp for fp8: fuzz seed 20261126306379)
    if t.dtype == torch.float64 and dt is DataType.HALF:
        t = _to_f32_odd(t)
    if dt is DataType.FP8_E4M3:
        t = t.clamp(-_E4M3_MAX, _E4M3_MAX)  # NaN stays NaN
    return t.to(target)


def _to_f32_odd(t: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded to odd (toward zero, the last bit set when inexact), so that a
    further round to nearest into fp16 rounds once, from the float64 value, as the reference (NumPy)
    and generated kernels (cvt.rn.f16.f64) do. PyTorch converts float64 to half through float32,
    rounding twice: f16(1.3950195536) gave 1.39453 (a tie of fp16 in fp32), not 1.3955 (fuzz seed
    20261126106267). (bfloat16 and fp8 are defined through float32: opgraph/core/rounding.py.)"""
    import torch

    r = t.to(torch.float32)
    back = r.to(torch.float64)
    bits = r.view(torch.int32)
    bits = torch.where(back.abs() > t.abs(), bits - 1, bits)  # rounded away from zero: one step back
    bits = torch.where(back != t, bits | 1, bits)  # (NaN stays NaN)
    return bits.view(torch.float32)


@dataclass
class Call:
    """One node as a mapping sees it: operands in the compute type, scalars, output descriptors.

    `values` holds every tensor computed so far or bound (torch tensors, or Python numbers for
    pass-by-value scalars); `tensor_cores` (on CUDA) lets GEMM-class mappings use tensor cores
    where that is exact (see gemm.py).
    """

    node: Node
    tensors: Mapping[int, TensorDesc]
    values: Mapping[int, Any]
    device: Any
    tensor_cores: bool = False
    _roles: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        import torch

        self._roles = dict(zip(self.node.op.input_roles(), self.node.inputs))
        self.compute = torch.float64 if wide_compute(self.node, self.tensors) else torch.float32

    # -- inputs ----------------------------------------------------------------------------------
    def has(self, role: str) -> bool:
        return self._roles.get(role) is not None

    def desc(self, role: str) -> TensorDesc | None:
        v = self._roles.get(role)
        return self.tensors[v] if isinstance(v, int) else None

    def tensor_desc(self, role: str) -> TensorDesc:
        """`desc(role)` of an input the op's checks made a tensor."""
        return expect(self.desc(role), f"the tensor of {self.node.label()}'s input '{role}'")

    def raw(self, role: str) -> Any:
        """The input as stored: a torch tensor of its declared type, a Python number or None."""
        v = self._roles.get(role)
        if v is None:
            return None
        if isinstance(v, Const):
            return v.value
        return self.values[v]

    def tensor(self, role: str, dtype: Any = None) -> torch.Tensor:
        """The input as a torch tensor in the compute type (or `dtype`), logical dims."""
        import torch

        value = self.raw(role)
        dtype = self.compute if dtype is None else dtype
        if not isinstance(value, torch.Tensor):
            if dtype.is_floating_point:  # rounded to the compute type: 1e308 in fp32 is inf (torch refuses it)
                return torch.full((), float(value), dtype=torch.float64, device=self.device).to(dtype)
            if isinstance(value, int):  # exact (a Philox seed above 2**53 does not survive a float)
                return torch.full((), value, dtype=dtype, device=self.device)
            return torch.full((), float(value), dtype=dtype, device=self.device)
        return value.to(dtype)

    def operand(self, role: str) -> torch.Tensor | None:
        """A pointwise-style operand: 1-element tensors and numbers become 0-d (they broadcast to
        anything, whatever their rank)."""
        if not self.has(role):
            return None
        t = self.tensor(role)
        return t.reshape(()) if t.numel() == 1 else t

    @overload
    def scalar(self, role: str, default: float) -> torch.Tensor: ...
    @overload
    def scalar(self, role: str, default: None = None) -> torch.Tensor | None: ...

    def scalar(self, role: str, default: float | None = None) -> torch.Tensor | None:
        """A scalar input (epsilon, momentum, a clip) as a 0-d tensor in the compute type, read on
        the device at run time (no host synchronisation)."""
        if not self.has(role):
            if default is None:
                return None
            import torch

            return torch.full((), float(default), dtype=self.compute, device=self.device)
        return self.tensor(role).reshape(())

    # -- outputs ---------------------------------------------------------------------------------
    def out(self, role: str) -> TensorDesc | None:
        uid = self.node.outputs[self.node.op.output_roles().index(role)]
        return None if uid is None else self.tensors[uid]

    def wants(self, role: str) -> bool:
        return self.out(role) is not None


def finish(result: Any, desc: TensorDesc, node: Node) -> Any:
    """A mapping's result for output `desc`: broadcast to its dims, rounded to its type."""
    import torch

    if not isinstance(result, torch.Tensor):
        raise ExecutionError(
            f"the torch mapping returned a {type(result).__name__}, not a tensor",
            op=node.label(),
            tensor=desc,
            rule="torch.mapping_result",
            hint="a bug in opgraph's torch engine: please report it with the graph",
        )
    if tuple(result.shape) != desc.dim:
        result = torch.broadcast_to(result, desc.dim)
    return round_to(result, desc.data_type)
