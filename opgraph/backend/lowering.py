"""Finalize for operation graphs: an operation graph becomes an opgraph Graph (one op per operation
descriptor, tensors by UID) validated by opgraph, and opgraph's errors come back naming the operation
descriptor and the attribute that holds the tensor. (Tensors and op attribute descriptors are checked
at their own finalize, in descriptor_checks.py.)

alpha / beta: y = alpha * op(...) + beta * y_old. A host value is baked in; a 1-element TENSOR
descriptor is a device scalar bound by its UID; a VOID_PTR is a device scalar at that address
(bound by the backend at every execute). beta != 0 reads y_old through an internal input tensor bound
to Y's own buffer: an in-place update through the variant pack (opgraph.aliasing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.device import Device
from ..core.dtypes import DataType
from ..core.errors import GraphError, expect
from ..core.ir import FinalGraph
from ..core.registry import Registry
from ..core.tensor import Tensor
from ..cudnn.candidates import Planner
from ..cudnn.handles import Handle
from ..graph.builder import Graph
from ..ops.conv import ConvDgrad, ConvFprop, ConvWgrad
from ..ops.layernorm import Layernorm, LayernormBackward, Rmsnorm, RmsnormBackward
from ..ops.matmul import Matmul
from ..ops.norm import Batchnorm, BatchnormBackward, BatchnormInference, Instancenorm, InstancenormBackward
from ..ops.norm_common import NormForwardPhase
from ..ops.pointwise import MODES, Pointwise, PointwiseMode
from ..ops.pooling import Resample
from ..ops.reduction import GenStats, Reduction
from . import names as N
from .descriptor_checks import NOT_SUPPORTED, TensorInfo, _backward, _dtype
from .descriptors import FINALIZERS, BackendError, Descriptor
from .names import AttributeName as A
from .names import AttributeType as T
from .names import DescriptorType as D
from .names import Status


@dataclass
class LoweredGraph:
    """What a finalized operation graph holds: the opgraph graph, where each tensor came from, and the
    tensors the backend binds itself (beta's y_old: ("alias", uid of Y); device-pointer scalars:
    ("pointer", address or buffer))."""

    graph: Graph
    final: FinalGraph
    handle: Handle
    device: Device
    planner: Planner
    auto: dict[int, tuple[str, Any]] = field(default_factory=dict)


class _Lowering:
    def __init__(self, desc: Descriptor) -> None:
        self.desc = desc
        self.g = Graph(name=f"operation graph #{desc.serial}", io_data_type=DataType.FLOAT)
        self.declared: dict[int, Tensor] = {}
        self.produced: dict[int, Tensor] = {}
        self.origin: dict[int, tuple[Descriptor, A]] = {}
        self.auto: dict[int, tuple[str, Any]] = {}
        self.infos: dict[int, TensorInfo] = {}
        uids = [
            t.state.uid
            for op in desc.values(A.CUDNN_ATTR_OPERATIONGRAPH_OPS)
            for _, (k, vs) in op.attrs.items()
            if k is T.CUDNN_TYPE_BACKEND_DESCRIPTOR
            for t in vs
            if t.type is D.CUDNN_BACKEND_TENSOR_DESCRIPTOR
        ]
        self.next_uid = max(uids, default=0) + 1

    def info(self, op: Descriptor, name: A) -> TensorInfo | None:
        t = op.value(name)
        if t is None:
            return None
        info = t.state
        seen = self.infos.setdefault(info.uid, info)
        if seen != info:
            raise BackendError(
                f"UID {info.uid} is given to two tensor descriptors that differ ({seen} and {info})",
                descriptor=op,
                attribute=name,
                rule="tensor.duplicate_uid",
                hint="describe each tensor once (reuse the descriptor) or give it another UID",
            )
        self.origin.setdefault(info.uid, (op, name))
        return info

    def required_info(self, op: Descriptor, name: A) -> TensorInfo:
        """`info` of an attribute the operation cannot do without (finalize has checked it is set)."""
        info = self.info(op, name)
        if info is None:
            raise BackendError(
                f"{name.name} is not set",
                descriptor=op,
                attribute=name,
                rule="backend.required",
                hint=f"set {name.name} before finalizing the operation graph",
            )
        return info

    def inp(self, op: Descriptor, name: A) -> Tensor | None:
        info = self.info(op, name)
        if info is None:
            return None
        if info.uid in self.produced:
            return self.produced[info.uid]
        if info.uid not in self.declared:
            self.declared[info.uid] = self.g.tensor(
                dim=info.dim,
                stride=info.stride,
                data_type=info.data_type,
                name=f"t{info.uid}",
                uid=info.uid,
                is_virtual=info.is_virtual,
                is_pass_by_value=info.is_by_value,
            )
        return self.declared[info.uid]

    def required_input(self, op: Descriptor, name: A) -> Tensor:
        self.required_info(op, name)
        return expect(self.inp(op, name), f"the tensor of {name.name}")  # declared or found: the info is there

    def out(self, op: Descriptor, name: A, t: Tensor | None) -> None:
        info = self.info(op, name)
        if info is None or t is None:
            return
        if info.uid in self.produced:
            raise BackendError(
                f"UID {info.uid} is the output of two operations",
                descriptor=op,
                attribute=name,
                rule="dataflow.two_producers",
                hint="give each operation output its own tensor",
            )
        t.set_uid(info.uid).set_dim(info.dim).set_stride(info.stride).set_data_type(info.data_type).set_name(
            f"t{info.uid}"
        )
        t.set_output(not info.is_virtual)
        self.produced[info.uid] = t

    def internal(
        self, dim: tuple[int, ...], stride: tuple[int, ...], data_type: DataType, how: tuple[str, Any]
    ) -> Tensor:
        uid, self.next_uid = self.next_uid, self.next_uid + 1
        self.auto[uid] = how
        return self.g.tensor(dim=dim, stride=stride, data_type=data_type, name=f"internal{uid}", uid=uid)

    def scalar(self, op: Descriptor, name: A, neutral: float) -> Any:
        """alpha/beta: None when it is the neutral value, else a number or a 1-element tensor."""
        kind = op.kind_of(name)
        if kind is None:
            return None
        v = op.value(name)
        if kind in (T.CUDNN_TYPE_FLOAT, T.CUDNN_TYPE_DOUBLE):
            return None if v == neutral else v
        if kind is T.CUDNN_TYPE_VOID_PTR:
            return self.internal((1,), (1,), DataType.FLOAT, ("pointer", v))
        t, dim = self.required_input(op, name), self.required_info(op, name).dim
        if math.prod(dim) != 1:
            raise BackendError(
                f"a device alpha/beta is one value, {t.label()} has dimensions {list(dim)}",
                descriptor=op,
                attribute=name,
                rule="backend.scalar",
                hint="use a [1, 1, ...] tensor",
            )
        return t

    def epilogue(self, op: Descriptor, y: Tensor, y_attr: A, alpha: Any, beta: Any, beta_attr: A) -> Tensor:
        """alpha * y + beta * y_old, written as Y."""
        if alpha is not None:
            y = self.g.scale(y, alpha, name=f"{self._name(op)}::alpha")
        if beta is not None:
            info = self.required_info(op, y_attr)
            if info.is_virtual:
                raise BackendError(
                    "beta needs the previous Y, but Y is virtual",
                    descriptor=op,
                    attribute=beta_attr,
                    rule="backend.beta_virtual",
                    hint="make Y non-virtual, or set beta to 0",
                )
            old = self.internal(info.dim, info.stride, info.data_type, ("alias", info.uid))
            y = self.g.add(y, self.g.scale(old, beta, name=f"{self._name(op)}::beta"), name=f"{self._name(op)}::axpby")
        return y

    @staticmethod
    def _name(op: Descriptor) -> str:
        return f"{op.type.name.removeprefix('CUDNN_BACKEND_OPERATION_').removesuffix('_DESCRIPTOR')}#{op.serial}"

    def add(self, op: Descriptor, kind: Any, inputs: list[Any], outputs: dict[str, A], compute: Any = None) -> list:
        """Add op `kind` reading `inputs`, with the output roles whose descriptor attributes are set."""
        roles = [r for r in kind.output_roles() if r in outputs and op.has(outputs[r])]
        handles = self.g._add_op(kind, inputs, name=self._name(op), compute_data_type=compute, outputs=roles)
        for role, handle in zip(kind.output_roles(), handles):
            if role in roles:
                self.out(op, outputs[role], handle)
        return handles


LOWER: Registry[D, Callable[[_Lowering, Descriptor], None]] = Registry("backend lowering")


def _lowers(kind: D) -> Callable:
    def register(fn: Callable) -> Callable:
        LOWER.register(kind, fn)
        return fn

    return register


def _conv_attrs(c: Descriptor) -> dict[str, Any]:
    return dict(
        pre_padding=tuple(c.values(A.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS)),
        post_padding=tuple(c.values(A.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS)),
        stride=tuple(c.values(A.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES)),
        dilation=tuple(c.values(A.CUDNN_ATTR_CONVOLUTION_DILATIONS)),
        convolution_mode=N.CONV_MODES[c.value(A.CUDNN_ATTR_CONVOLUTION_CONV_MODE)],
    )


def _conv(kind: type, prefix: str, ins: tuple[str, str], out: str) -> Callable:
    def lower(lw: _Lowering, op: Descriptor) -> None:
        c = op.value(A[f"CUDNN_ATTR_{prefix}_CONV_DESC"])
        y_attr, alpha, beta = (A[f"CUDNN_ATTR_{prefix}_{s}"] for s in (out, "ALPHA", "BETA"))
        inputs = [lw.inp(op, A[f"CUDNN_ATTR_{prefix}_{r}"]) for r in ins]
        comp = _dtype(c, A.CUDNN_ATTR_CONVOLUTION_COMP_TYPE)
        y = lw.g._add_op(kind(**_conv_attrs(c)), inputs, name=lw._name(op), compute_data_type=comp)[0]
        y = expect(y, "the convolution's output")  # every output role was asked for
        info = lw.required_info(op, y_attr)
        a, b = lw.scalar(op, alpha, 1.0), lw.scalar(op, beta, 0.0)
        if a is None and b is None:
            lw.out(op, y_attr, y)
            return
        y.set_dim(info.dim).set_data_type(comp or DataType.FLOAT)
        lw.out(op, y_attr, lw.epilogue(op, y, y_attr, a, b, beta))

    return lower


LOWER.register(
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
    _conv(ConvFprop, "OPERATION_CONVOLUTION_FORWARD", ("X", "W"), "Y"),
)
LOWER.register(
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
    _conv(ConvDgrad, "OPERATION_CONVOLUTION_BWD_DATA", ("DY", "W"), "DX"),
)
LOWER.register(
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
    _conv(ConvWgrad, "OPERATION_CONVOLUTION_BWD_FILTER", ("X", "DY"), "DW"),
)


@_lowers(D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
def _pointwise(lw: _Lowering, op: Descriptor) -> None:
    pw = op.value(A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR)
    mode = N.POINTWISE_MODES[pw.value(A.CUDNN_ATTR_POINTWISE_MODE)]
    if _backward(mode):
        operands = [
            lw.inp(op, A.CUDNN_ATTR_OPERATION_POINTWISE_DYDESC),
            lw.inp(op, A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC),
        ]
        out = A.CUDNN_ATTR_OPERATION_POINTWISE_DXDESC
    else:
        operands = [
            lw.inp(op, a)
            for a in (
                A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                A.CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
            )
        ][: MODES[mode].arity]
        out = A.CUDNN_ATTR_OPERATION_POINTWISE_YDESC
    for i, attr in enumerate((A.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, A.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2)):
        alpha = lw.scalar(op, attr, 1.0)
        if alpha is not None and i < len(operands) and not _backward(mode):
            operands[i] = lw.g.scale(operands[i], alpha, name=f"{lw._name(op)}::alpha{i + 1}")
    params = {
        "lower_clip": A.CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP,
        "upper_clip": A.CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP,
        "negative_slope": A.CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE,
        "alpha": A.CUDNN_ATTR_POINTWISE_ELU_ALPHA,
        "beta": A.CUDNN_ATTR_POINTWISE_SOFTPLUS_BETA,
        "swish_beta": A.CUDNN_ATTR_POINTWISE_SWISH_BETA,
    }
    roles = [p for p, _ in MODES[mode].params]
    values = [pw.value(params[r]) for r in roles]
    axis = pw.value(A.CUDNN_ATTR_POINTWISE_AXIS)
    kind = Pointwise(mode=mode, axis=axis if mode is PointwiseMode.GEN_INDEX else None)
    lw.add(op, kind, operands + values, {"output": out}, _dtype(pw, A.CUDNN_ATTR_POINTWISE_MATH_PREC))


@_lowers(D.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)
def _matmul_op(lw: _Lowering, op: Descriptor) -> None:
    m = op.value(A.CUDNN_ATTR_OPERATION_MATMUL_DESC)
    lw.add(
        op,
        Matmul(),
        [lw.inp(op, A.CUDNN_ATTR_OPERATION_MATMUL_ADESC), lw.inp(op, A.CUDNN_ATTR_OPERATION_MATMUL_BDESC)],
        {"C": A.CUDNN_ATTR_OPERATION_MATMUL_CDESC},
        _dtype(m, A.CUDNN_ATTR_MATMUL_COMP_TYPE),
    )


@_lowers(D.CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)
def _reduction(lw: _Lowering, op: Descriptor) -> None:
    r = op.value(A.CUDNN_ATTR_OPERATION_REDUCTION_DESC)
    lw.add(
        op,
        Reduction(mode=N.REDUCTION_MODES[r.value(A.CUDNN_ATTR_REDUCTION_OPERATOR)]),
        [lw.inp(op, A.CUDNN_ATTR_OPERATION_REDUCTION_XDESC)],
        {"output": A.CUDNN_ATTR_OPERATION_REDUCTION_YDESC},
        _dtype(r, A.CUDNN_ATTR_REDUCTION_COMP_TYPE),
    )


@_lowers(D.CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR)
def _genstats(lw: _Lowering, op: Descriptor) -> None:
    lw.add(
        op,
        GenStats(),
        [lw.inp(op, A.CUDNN_ATTR_OPERATION_GENSTATS_XDESC)],
        {"sum": A.CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, "sq_sum": A.CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC},
        _dtype(op, A.CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC),
    )


@_lowers(D.CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR)
def _resample_op(lw: _Lowering, op: Descriptor) -> None:
    r = op.value(A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC)
    kind = Resample(
        mode=N.RESAMPLE_MODES[r.value(A.CUDNN_ATTR_RESAMPLE_MODE)],
        window=tuple(r.values(A.CUDNN_ATTR_RESAMPLE_WINDOW_DIMS)),
        stride=tuple(r.values(A.CUDNN_ATTR_RESAMPLE_STRIDES)),
        pre_padding=tuple(r.values(A.CUDNN_ATTR_RESAMPLE_PRE_PADDINGS)),
        post_padding=tuple(r.values(A.CUDNN_ATTR_RESAMPLE_POST_PADDINGS)),
        generate_index=op.has(A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC),
    )
    for attr, neutral in (
        (A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_ALPHA, 1.0),
        (A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_BETA, 0.0),
    ):
        if lw.scalar(op, attr, neutral) is not None:
            raise BackendError(
                "resample alpha/beta other than 1/0 are not supported",
                descriptor=op,
                attribute=attr,
                status=NOT_SUPPORTED,
                rule="resample.scale",
                hint="scale with a pointwise op after it",
            )
    lw.add(
        op,
        kind,
        [lw.inp(op, A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC)],
        {"output": A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC, "index": A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_IDXDESC},
        _dtype(r, A.CUDNN_ATTR_RESAMPLE_COMP_TYPE),
    )


def _norm_kind(op: Descriptor, mode_attr: A, table: dict) -> Any:
    mode = op.value(mode_attr)
    if mode not in table:
        raise BackendError(
            f"{mode.name} is not supported here",
            descriptor=op,
            attribute=mode_attr,
            status=NOT_SUPPORTED,
            rule="norm.mode",
            hint=f"use {', '.join(m.name for m in table)}",
        )
    return table[mode]


_M = N.cudnnBackendNormMode_t


@_lowers(D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)
def _norm_forward(lw: _Lowering, op: Descriptor) -> None:
    a = {
        r: A[f"CUDNN_ATTR_OPERATION_NORM_FWD_{r}"]
        for r in (
            "XDESC",
            "YDESC",
            "MEAN_DESC",
            "INV_VARIANCE_DESC",
            "SCALE_DESC",
            "BIAS_DESC",
            "EPSILON_DESC",
            "EXP_AVG_FACTOR_DESC",
            "INPUT_RUNNING_MEAN_DESC",
            "INPUT_RUNNING_VAR_DESC",
            "OUTPUT_RUNNING_MEAN_DESC",
            "OUTPUT_RUNNING_VAR_DESC",
        )
    }
    if op.values(A.CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS):
        raise BackendError(
            "peer statistics (multi-GPU batchnorm) are not supported",
            descriptor=op,
            attribute=A.CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS,
            status=NOT_SUPPORTED,
            rule="norm.peer_stats",
            hint="all-reduce the statistics outside the graph",
        )
    phase = N.NORM_PHASES[op.value(A.CUDNN_ATTR_OPERATION_NORM_FWD_PHASE)]
    mode = _norm_kind(
        op,
        A.CUDNN_ATTR_OPERATION_NORM_FWD_MODE,
        {
            _M.CUDNN_BATCH_NORM: "batch",
            _M.CUDNN_LAYER_NORM: "layer",
            _M.CUDNN_RMS_NORM: "rms",
            _M.CUDNN_INSTANCE_NORM: "instance",
        },
    )
    x, scale, bias, eps = (lw.inp(op, a[r]) for r in ("XDESC", "SCALE_DESC", "BIAS_DESC", "EPSILON_DESC"))
    outs = {
        "y": a["YDESC"],
        "mean": a["MEAN_DESC"],
        "inv_variance": a["INV_VARIANCE_DESC"],
        "next_running_mean": a["OUTPUT_RUNNING_MEAN_DESC"],
        "next_running_var": a["OUTPUT_RUNNING_VAR_DESC"],
    }
    if mode == "batch" and phase is NormForwardPhase.INFERENCE:
        lw.add(
            op,
            BatchnormInference(),
            [x, lw.inp(op, a["MEAN_DESC"]), lw.inp(op, a["INV_VARIANCE_DESC"]), scale, bias],
            {"y": a["YDESC"]},
        )
    elif mode == "batch":
        rm, rv, momentum = (
            lw.inp(op, a[r]) for r in ("INPUT_RUNNING_MEAN_DESC", "INPUT_RUNNING_VAR_DESC", "EXP_AVG_FACTOR_DESC")
        )
        lw.add(op, Batchnorm(), [x, scale, bias, rm, rv, eps, momentum], outs)
    else:
        kind = {"layer": Layernorm, "rms": Rmsnorm, "instance": Instancenorm}[mode](norm_forward_phase=phase)
        lw.add(op, kind, [x, scale, bias, eps], outs)


@_lowers(D.CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)
def _norm_backward(lw: _Lowering, op: Descriptor) -> None:
    a = {
        r: A[f"CUDNN_ATTR_OPERATION_NORM_BWD_{r}"]
        for r in (
            "XDESC",
            "DYDESC",
            "DXDESC",
            "MEAN_DESC",
            "INV_VARIANCE_DESC",
            "SCALE_DESC",
            "EPSILON_DESC",
            "DSCALE_DESC",
            "DBIAS_DESC",
        )
    }
    if op.values(A.CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS):
        raise BackendError(
            "peer statistics (multi-GPU batchnorm) are not supported",
            descriptor=op,
            attribute=A.CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS,
            status=NOT_SUPPORTED,
            rule="norm.peer_stats",
            hint="all-reduce the statistics outside the graph",
        )
    mode = _norm_kind(
        op,
        A.CUDNN_ATTR_OPERATION_NORM_BWD_MODE,
        {
            _M.CUDNN_BATCH_NORM: "batch",
            _M.CUDNN_LAYER_NORM: "layer",
            _M.CUDNN_RMS_NORM: "rms",
            _M.CUDNN_INSTANCE_NORM: "instance",
        },
    )
    dy, x, scale, mean, inv, eps = (
        lw.inp(op, a[r]) for r in ("DYDESC", "XDESC", "SCALE_DESC", "MEAN_DESC", "INV_VARIANCE_DESC", "EPSILON_DESC")
    )
    outs = {"dx": a["DXDESC"], "dscale": a["DSCALE_DESC"], "dbias": a["DBIAS_DESC"]}
    if mode == "batch":
        lw.add(op, BatchnormBackward(), [dy, x, scale, mean, inv, eps], outs)
    elif mode == "layer":
        lw.add(op, LayernormBackward(), [dy, x, scale, mean, inv], outs)
    elif mode == "rms":
        lw.add(op, RmsnormBackward(), [dy, x, scale, inv], outs)
    else:
        lw.add(op, InstancenormBackward(), [dy, x, scale, mean, inv, eps], outs)


def _operation_graph(desc: Descriptor) -> LoweredGraph:
    handle = desc.value(A.CUDNN_ATTR_OPERATIONGRAPH_HANDLE)
    lw = _Lowering(desc)
    ops = desc.values(A.CUDNN_ATTR_OPERATIONGRAPH_OPS)
    try:
        for op in ops:
            LOWER[op.type](lw, op)
        final = lw.g.final
        planner = Planner(final, handle.device)
    except BackendError:
        raise
    except GraphError as err:
        raise _located(err, desc, lw, ops) from None
    return LoweredGraph(lw.g, final, handle, handle.device, planner, lw.auto)


def _located(err: GraphError, desc: Descriptor, lw: _Lowering, ops: list[Descriptor]) -> BackendError:
    """opgraph's error, placed at the operation descriptor and attribute it concerns."""
    op = next((o for o in ops if f"'{lw._name(o)}'" in err.op or f"'{lw._name(o)}::" in err.op), None)
    uid = next((u for u in lw.origin if f"(uid {u})" in err.tensor), None)
    attr = None
    if uid is not None:
        owner, attr = lw.origin[uid]
        op = op or owner
        if op is not owner:  # the tensor is also read by `op`: name the attribute of `op` that holds it
            attr = next(
                (
                    n
                    for n, (k, vs) in op.attrs.items()
                    if k is T.CUDNN_TYPE_BACKEND_DESCRIPTOR
                    for v in vs
                    if v.type is D.CUDNN_BACKEND_TENSOR_DESCRIPTOR and v.state.uid == uid
                ),
                attr,
            )
    status = NOT_SUPPORTED if err.rule.startswith(("engine.", "partition.")) else Status.CUDNN_STATUS_BAD_PARAM
    return BackendError(
        err.detail,
        descriptor=op or desc,
        attribute=attr,
        status=status,
        rule=err.rule,
        hint=err.hint,
        tensor=err.tensor,
    )


FINALIZERS[D.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR] = _operation_graph

__all__ = ["LOWER", "LoweredGraph", "TensorInfo"]
