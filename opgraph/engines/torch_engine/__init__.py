"""The torch engine: every op, one by one, through PyTorch on the plan's device.

It is the fallback that makes every valid graph run on a GPU: a piece of any ops is one kernel
whose `run` calls the ops' torch mappings in order (cuDNN/cuBLAS for convolutions and matmuls,
ATen kernels for the rest). On the CPU (device="cpu") the same mappings run on CPU tensors that
alias the NumPy buffers, which is how the tests check them.

Behaviour:
- numerics follow the reference engine: float32 compute (float64 for DOUBLE, INT32 or INT64 data),
  every op output rounded to its declared type, intermediates included (see common.py);
- fp32 convolutions and matmuls are exact fp32 on CUDA (TF32 off, see precision.py); fp16/bf16 ones
  run on tensor cores where that is exact: natively with fp32 accumulation when the output has the
  operands' type, else as fp32 with TF32, which holds fp16/bf16/fp8 values exactly (gemm.py;
  NumericalNote.TENSOR_CORE); on the CPU operands are upcast to fp32;
- scalars (epsilon, momentum, clips) given as 1-element tensors stay on the device: no op of the
  engine reads a device value on the host, except the host fallback;
- an op without a torch mapping runs its reference implementation on the host (HOST_EXECUTION,
  a synchronisation per such op);
- a piece's outputs are written with `copy_` into the bound buffers (any strides), once every op
  of the piece ran, so an in-place update reads its old value.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any

from ...core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support
from ...core.device import Device
from ...core.dtypes import DataType
from ...core.errors import ExecutionError
from ...core.piece import Piece
from ...core.tensor import storage_extent
from ...core.types import Buffer, Stream
from ...ops.custom import Custom
from .. import register_engine
from ..base import Engine, Kernel
from ..shared.native_gemm import native_gemm, widening_gemm, widening_types
from . import (  # noqa: F401  (register mappings)
    adalayernorm,
    attention,
    causal_conv1d,
    collective,
    conv,
    custom,
    gather,
    gemm,
    layout,
    matmul,
    norm,
    pointwise,
    pooling,
    reduction,
    scan,
)
from .common import IMPLS, Call, as_torch, finish, wide_compute
from .estimate import estimate_us
from .host import run_on_host
from .precision import exact_gemm16, exact_math

_GEMM = frozenset({"conv_fprop", "conv_dgrad", "conv_wgrad", "matmul"})


def _torch_device(device: Device) -> Any:
    import torch

    return torch.device(device.torch_name)


def host_ops(piece: Piece) -> list[str]:
    """Labels of the piece's ops that have no torch mapping (they run on the host)."""
    return [
        n.label()
        for n in piece.nodes
        if n.kind not in IMPLS or (isinstance(n.op, Custom) and n.op.definition.torch is None)
    ]


def _tensor_core_ops(piece: Piece) -> bool:
    """Whether a conv/matmul of the piece runs on tensor cores (on CUDA, see gemm.py)."""
    tensors = piece.graph.tensors
    for n in piece.nodes:
        if n.kind in _GEMM:
            a, b = (tensors[u].data_type for u in n.input_uids()[:2])
            out = tensors[n.output_uids()[0]].data_type
            if gemm.uses_tensor_cores(a, b, out, wide_compute(n, tensors)):
                return True
    return False


def _widened(node: Any, tensors: Mapping[int, Any]) -> bool:
    """A matmul of fp16/bf16 operands of one type with an fp32 result: cuBLAS's fp32 output (gemm.widened), or
    TF32 on values TF32 holds exactly; either way no input is down-converted."""
    a, b = (tensors[u].data_type for u in node.input_uids()[:2])
    return node.kind == "matmul" and widening_types(a, b, tensors[node.output_uids()[0]].data_type)


def make_config(piece: Piece, device: Device, mode: HeurMode) -> EngineConfig:
    fallback = host_ops(piece)
    numerical: set[NumericalNote] = set()
    behavior: set[BehaviorNote] = set()
    if any(wide_compute(n, piece.graph.tensors) for n in piece.nodes):
        numerical.add(NumericalNote.FP64_ACCUMULATION)
    tensor_cores = device.is_cuda and _tensor_core_ops(piece)
    if tensor_cores:
        numerical.add(NumericalNote.TENSOR_CORE)
    if device.is_cuda and any(
        n.kind in _GEMM
        and piece.graph.tensors[n.output_uids()[0]].data_type in (DataType.FLOAT, DataType.DOUBLE)
        and not _widened(n, piece.graph.tensors)
        for n in piece.nodes
    ):
        # cuDNN/cuBLAS fp32 results carry TF32-level error even with PyTorch's TF32 flags pinned off
        # (bench/results/constants.md#torch-fp32-gemms), so say so rather than promise fp32
        numerical.add(NumericalNote.DOWN_CONVERT_INPUTS)
    if device.is_cuda and any(n.kind in ("conv_dgrad", "conv_wgrad") for n in piece.nodes):
        numerical.add(NumericalNote.NONDETERMINISTIC)  # cuDNN may pick atomics-based algorithms
    if fallback or not device.is_cuda:
        behavior.add(BehaviorNote.HOST_EXECUTION)
    if not fallback:
        behavior.add(BehaviorNote.DEVICE_SCALARS)
        if device.is_cuda:
            behavior.add(BehaviorNote.CUDA_GRAPH_CAPTURABLE)  # capturable; updates re-capture
    why = f"op by op through PyTorch on {device.kind} ({len(piece.nodes)} op(s))"
    if fallback:
        why += "; on the host through the reference engine (no torch mapping): " + ", ".join(fallback)
    return EngineConfig(
        "torch",
        (),
        frozenset(numerical),
        frozenset(behavior),
        estimate_us=estimate_us(piece, device, tensor_cores, native=native_gemm(piece) or widening_gemm(piece)),
        why=why,
    )


class TorchKernel(Kernel):
    """Runs a piece's nodes in order with their torch mappings (or the host fallback)."""

    def __init__(self, piece: Piece, config: EngineConfig, device: Device) -> None:
        super().__init__(piece, config)
        self.device = device
        self.tensor_cores = device.is_cuda
        # resolved at compile time, so that a mapping removed later does not change a built plan
        self.steps = [(n, IMPLS.get(n.kind, run_on_host)) for n in piece.nodes]
        # a lone 16-bit matmul (its result 16-bit or fp32): cuBLAS writes the output buffer itself (no
        # result tensor copied out)
        self.direct = device.is_cuda and (native_gemm(piece) or widening_gemm(piece))

    def _stream(self, stream: Any) -> Any:
        if stream is None or not self.device.is_cuda:
            return nullcontext()
        import torch

        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=_torch_device(self.device))
        return torch.cuda.stream(stream)

    def _load(self, uid: int, buffers: Mapping[int, Buffer], dev: Any) -> Any:
        desc = self.piece.tensor(uid)
        t = as_torch(buffers[uid], desc, dev)
        if not desc.is_pass_by_value and tuple(t.shape) != desc.dim and t.numel() == 1:
            t = t.reshape(desc.dim)  # a 1-element buffer binds whatever its rank
        return t

    def run(self, buffers: Mapping[int, Buffer], stream: Stream = None, scratch: Buffer = None) -> None:
        dev = _torch_device(self.device)
        if self.direct and self._direct(buffers, stream, dev):
            return
        with self._stream(stream), exact_math(self.device.is_cuda):
            self._write(buffers, self._evaluate(self.steps, buffers, dev), dev)

    def _evaluate(self, steps: list[tuple[Any, Any]], buffers: Mapping[int, Buffer], dev: Any) -> dict[int, Any]:
        """`steps` run in order: every tensor they read or make (the piece's inputs loaded as first read)."""
        tensors = self.piece.graph.tensors
        values: dict[int, Any] = {}
        for node, impl in steps:
            for uid in node.input_uids():
                if uid not in values:  # a piece input (an in-place one too: read before written)
                    values[uid] = self._load(uid, buffers, dev)
            results = self._call(node, impl, Call(node, tensors, values, dev, self.tensor_cores))
            for out_uid, result in zip(node.outputs, results):
                if out_uid is not None and result is not None:
                    values[out_uid] = finish(result, tensors[out_uid], node)
        return values

    def _direct(self, buffers: Mapping[int, Buffer], stream: Stream, dev: Any) -> bool:
        """The lone 16-bit matmul into its output buffer (torch.matmul's `out=`; an fp32 result through
        gemm.widened), or False where the output's bytes meet an operand's (an in-place pack: the general
        path computes, then copies) or the shapes have no fp32-output call. Bytes, not storages: a plan's
        intermediates are views of one workspace."""
        import torch

        node = self.piece.nodes[-1]
        values: dict[int, Any] = {}
        if len(self.steps) > 1:  # the operands' views (a reshape PyTorch must copy runs on the plan's stream)
            with self._stream(stream):
                values = self._evaluate(self.steps[:-1], buffers, dev)
        a, b = (values[u] if u in values else self._load(u, buffers, dev) for u in node.input_uids())
        c_uid = node.output_uids()[0]
        dst = as_torch(buffers[c_uid], self.piece.tensor(c_uid), dev)
        if _meet(dst, a) or _meet(dst, b):
            return False
        if b.dim() > 2 and all(d == 1 for d in b.shape[:-2]):
            # a weight broadcast over the batch: torch.matmul folds the batch into M for a 2-D B (one GEMM,
            # as measured) where it would run a batched GEMM, slower for an LM head (bench/results/
            # constants.md#lone-matmuls)
            b = b.reshape(b.shape[-2:])
        with self._stream(stream), exact_gemm16():
            try:
                if dst.dtype != a.dtype:
                    return gemm.widened(a, b, out=dst) is not None
                torch.matmul(a, b, out=dst)
            except (RuntimeError, TypeError, ValueError) as err:
                raise ExecutionError(
                    f"PyTorch failed on {self.device}: {type(err).__name__}: {err}",
                    op=node.label(),
                    rule="torch.op_failed",
                    hint="build without the 'torch' engine for this graph, and report the graph (opgraph JSON)",
                ) from err
        return True

    def _call(self, node: Any, impl: Any, call: Call) -> Any:
        try:
            return impl(call)
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as err:
            raise ExecutionError(
                f"PyTorch failed on {self.device}: {type(err).__name__}: {err}",
                op=node.label(),
                rule="torch.op_failed",
                hint="build without the 'torch' engine for this graph (e.g. engines=['reference'] on the CPU), "
                "and report the graph (opgraph JSON) so the torch mapping can be fixed",
            ) from err

    def _write(self, buffers: Mapping[int, Buffer], values: Mapping[int, Any], dev: Any) -> None:
        for uid in self.piece.outputs:
            dst = as_torch(buffers[uid], self.piece.tensor(uid), dev)
            src = values[uid]
            if src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
                src = src.clone()  # an in-place update whose result still aliases its input
            dst.copy_(src.reshape(dst.shape) if src.shape != dst.shape else src)


def _meet(x: Any, y: Any) -> bool:
    """Whether the byte spans of two tensors' elements (first to last, strides as given) overlap."""
    a, c = x.data_ptr(), y.data_ptr()
    b = a + storage_extent(x.shape, x.stride()) * x.element_size()
    d = c + storage_extent(y.shape, y.stride()) * y.element_size()
    return a < b and c < d and a < d and c < b


@functools.cache
def _torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


class TorchEngine(Engine):
    name = "torch"
    writes_after_compute = True
    sizes_at_run_time = True  # PyTorch reads them from the tensors; the config depends on the ops alone

    def available(self, device: Device) -> Support:
        if not _torch_installed():
            return Support.no("PyTorch is not installed (pip install 'opgraph[torch]')")
        if device.is_cuda:
            import torch

            if not torch.cuda.is_available():
                return Support.no("this PyTorch build sees no CUDA GPU")
        return Support.yes()

    def supports(self, piece: Piece, device: Device) -> Support:
        # Every op has a torch mapping or runs on the host through the reference engine.
        alone = collective.check_alone(piece)
        return Support.no(alone) if alone is not None else self.available(device)

    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        return [make_config(piece, device, mode)]

    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel:
        kernel = TorchKernel(piece, config, device)
        if device.is_cuda and collective.lone_collective(piece):  # on a communication stream
            return collective.CollectiveKernel(piece, config, _torch_device(device), kernel._stream)
        return kernel

    def inplace_safe(self, config: EngineConfig) -> bool:
        return True  # outputs are copied out once every op of the piece ran

    def host_ops(self, piece: Piece) -> list[str]:
        """Labels of the piece's ops that have no torch mapping (the library engine asks, through the registry)."""
        return host_ops(piece)


register_engine(TorchEngine())
__all__ = ["IMPLS", "TorchEngine", "TorchKernel", "host_ops", "make_config"]
