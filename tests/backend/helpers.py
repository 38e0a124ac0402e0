"""Building backend descriptors in tests without C's ceremony: `desc(type, {attribute: value})`."""

from __future__ import annotations

from typing import Any

import numpy as np

import opgraph.backend as be
from opgraph.backend import AttributeName as A
from opgraph.backend import AttributeType as T
from opgraph.backend import DescriptorType as D

# the attribute type each attribute is set with here (its first type in the schema)
from opgraph.backend.schema import SCHEMA


def desc(kind: D, attrs: dict, finalize: bool = True) -> be.Descriptor:
    d = be.create_descriptor(kind)
    for name, value in attrs.items():
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], T):
            kind_, value = value
        else:
            kind_ = SCHEMA[kind][name].types[0]
        be.set_attribute(d, name, kind_, value)
    if finalize:
        be.finalize(d)
    return d


def packed(dims: list[int]) -> list[int]:
    out, step = [0] * len(dims), 1
    for i in range(len(dims) - 1, -1, -1):
        out[i] = step
        step *= dims[i]
    return out


def tensor(
    uid: int,
    dims: list[int],
    strides: list[int] | None = None,
    dtype: Any = None,
    virtual: bool = False,
    by_value: bool = False,
    finalize: bool = True,
) -> be.Descriptor:
    return desc(
        D.CUDNN_BACKEND_TENSOR_DESCRIPTOR,
        {
            A.CUDNN_ATTR_TENSOR_DATA_TYPE: dtype or be.cudnnDataType_t.CUDNN_DATA_FLOAT,
            A.CUDNN_ATTR_TENSOR_DIMENSIONS: dims,
            A.CUDNN_ATTR_TENSOR_STRIDES: strides or packed(dims),
            A.CUDNN_ATTR_TENSOR_UNIQUE_ID: uid,
            A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: 16,
            A.CUDNN_ATTR_TENSOR_IS_VIRTUAL: virtual,
            A.CUDNN_ATTR_TENSOR_IS_BY_VALUE: by_value,
        },
        finalize,
    )


def conv_desc(pad: int = 1, stride: int = 1, nsp: int = 2) -> be.Descriptor:
    return desc(
        D.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR,
        {
            A.CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS: nsp,
            A.CUDNN_ATTR_CONVOLUTION_COMP_TYPE: be.cudnnDataType_t.CUDNN_DATA_FLOAT,
            A.CUDNN_ATTR_CONVOLUTION_CONV_MODE: be.cudnnConvolutionMode_t.CUDNN_CROSS_CORRELATION,
            A.CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS: [pad] * nsp,
            A.CUDNN_ATTR_CONVOLUTION_POST_PADDINGS: [pad] * nsp,
            A.CUDNN_ATTR_CONVOLUTION_DILATIONS: [1] * nsp,
            A.CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES: [stride] * nsp,
        },
    )


def pointwise(
    mode: Any,
    x: be.Descriptor,
    y: be.Descriptor | None = None,
    b: be.Descriptor | None = None,
    t: be.Descriptor | None = None,
    **extra: Any,
) -> be.Descriptor:
    pw_attrs = {A.CUDNN_ATTR_POINTWISE_MODE: mode}
    op_attrs = {}
    for key, value in extra.items():
        (pw_attrs if key.startswith("CUDNN_ATTR_POINTWISE_") else op_attrs)[A[key]] = value
    pw = desc(D.CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw_attrs)
    attrs = {A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR: pw, A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC: x}
    for name, value in (
        (A.CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y),
        (A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b),
        (A.CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t),
    ):
        if value is not None:
            attrs[name] = value
    return desc(D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, {**attrs, **op_attrs})


def op_graph(handle: Any, ops: list[be.Descriptor]) -> be.Descriptor:
    return desc(
        D.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
        {A.CUDNN_ATTR_OPERATIONGRAPH_HANDLE: handle, A.CUDNN_ATTR_OPERATIONGRAPH_OPS: ops},
    )


def plan_for(handle: Any, graph: be.Descriptor, mode: Any = None) -> be.Descriptor:
    heur = desc(
        D.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
        {
            A.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH: graph,
            A.CUDNN_ATTR_ENGINEHEUR_MODE: mode or be.cudnnBackendHeurMode_t.CUDNN_HEUR_MODE_A,
        },
    )
    cfg = be.get_attribute(heur, A.CUDNN_ATTR_ENGINEHEUR_RESULTS, T.CUDNN_TYPE_BACKEND_DESCRIPTOR, 1)[0]
    return desc(
        D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
        {A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: handle, A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: cfg},
    )


def execute(handle: Any, plan: be.Descriptor, buffers: dict[int, Any], workspace: Any = None) -> Any:
    pack = desc(
        D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
        {
            A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: list(buffers),
            A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: list(buffers.values()),
            A.CUDNN_ATTR_VARIANT_PACK_WORKSPACE: workspace,
        },
    )
    return be.execute(handle, plan, pack)


def run(handle: Any, ops: list[be.Descriptor], buffers: dict[int, Any]) -> be.Descriptor:
    plan = plan_for(handle, op_graph(handle, ops))
    assert execute(handle, plan, buffers) is be.Status.CUDNN_STATUS_SUCCESS
    return plan


def nan(*shape: int, dtype=np.float32) -> np.ndarray:
    return np.full(shape, np.nan, dtype)
