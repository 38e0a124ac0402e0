"""opgraph.backend: every descriptor type and attribute: set, get, finalize and their refusals, each
naming the descriptor, the attribute, the rule and the fix, with cuDNN's status."""

from __future__ import annotations

import enum

import pytest

import opgraph.backend as be
from opgraph.backend import AttributeName as A
from opgraph.backend import AttributeType as T
from opgraph.backend import DescriptorType as D
from opgraph.backend import Status
from opgraph.backend.names import VALUE_ENUMS
from opgraph.backend.schema import SCHEMA

from .helpers import conv_desc, desc, op_graph, pointwise, tensor

F32 = be.cudnnDataType_t.CUDNN_DATA_FLOAT
HANDLE = be.create_handle("cpu")


def _t(uid, dims, **kw):
    return tensor(uid, dims, **kw)


def _norm_fwd():
    return {
        A.CUDNN_ATTR_OPERATION_NORM_FWD_MODE: be.cudnnBackendNormMode_t.CUDNN_LAYER_NORM,
        A.CUDNN_ATTR_OPERATION_NORM_FWD_PHASE: be.cudnnBackendNormFwdPhase_t.CUDNN_NORM_FWD_INFERENCE,
        A.CUDNN_ATTR_OPERATION_NORM_FWD_XDESC: _t(1, [2, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_FWD_YDESC: _t(2, [2, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC: _t(3, [1, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC: _t(4, [1, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC: _t(5, [1, 1], by_value=True),
    }


def _norm_bwd():
    return {
        A.CUDNN_ATTR_OPERATION_NORM_BWD_MODE: be.cudnnBackendNormMode_t.CUDNN_LAYER_NORM,
        A.CUDNN_ATTR_OPERATION_NORM_BWD_XDESC: _t(1, [2, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC: _t(2, [2, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC: _t(3, [2, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC: _t(4, [1, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC: _t(5, [2, 1]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC: _t(6, [2, 1]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC: _t(7, [1, 8]),
        A.CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC: _t(8, [1, 8]),
    }


def _graph():
    return op_graph(HANDLE, [pointwise(be.CUDNN_POINTWISE_ADD, _t(1, [2, 3]), _t(3, [2, 3]), _t(2, [2, 3]))])


def _engine():
    return desc(
        D.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
        {A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH: _graph(), A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: 0},
    )


def _cfg():
    return desc(D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, {A.CUDNN_ATTR_ENGINECFG_ENGINE: _engine()})


def _conv_op(prefix, roles, dims):
    return {
        **{A[f"CUDNN_ATTR_{prefix}_{r}"]: _t(i + 1, d) for i, (r, d) in enumerate(zip(roles, dims))},
        A[f"CUDNN_ATTR_{prefix}_CONV_DESC"]: conv_desc(),
    }


RECIPES = {
    D.CUDNN_BACKEND_TENSOR_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_TENSOR_DATA_TYPE: F32,
        A.CUDNN_ATTR_TENSOR_DIMENSIONS: [2, 3],
        A.CUDNN_ATTR_TENSOR_STRIDES: [3, 1],
        A.CUDNN_ATTR_TENSOR_UNIQUE_ID: 7,
        A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: 16,
    },
    D.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: lambda: dict(conv_desc().attrs),
    D.CUDNN_BACKEND_POINTWISE_DESCRIPTOR: lambda: {A.CUDNN_ATTR_POINTWISE_MODE: be.CUDNN_POINTWISE_ADD},
    D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR: desc(
            D.CUDNN_BACKEND_POINTWISE_DESCRIPTOR, {A.CUDNN_ATTR_POINTWISE_MODE: be.CUDNN_POINTWISE_ADD}
        ),
        A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC: _t(1, [2, 3]),
        A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC: _t(2, [2, 3]),
        A.CUDNN_ATTR_OPERATION_POINTWISE_YDESC: _t(3, [2, 3]),
    },
    D.CUDNN_BACKEND_MATMUL_DESCRIPTOR: lambda: {A.CUDNN_ATTR_MATMUL_COMP_TYPE: F32},
    D.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATION_MATMUL_ADESC: _t(1, [1, 2, 3]),
        A.CUDNN_ATTR_OPERATION_MATMUL_BDESC: _t(2, [1, 3, 4]),
        A.CUDNN_ATTR_OPERATION_MATMUL_CDESC: _t(3, [1, 2, 4]),
        A.CUDNN_ATTR_OPERATION_MATMUL_DESC: desc(
            D.CUDNN_BACKEND_MATMUL_DESCRIPTOR, {A.CUDNN_ATTR_MATMUL_COMP_TYPE: F32}
        ),
    },
    D.CUDNN_BACKEND_REDUCTION_DESCRIPTOR: lambda: {A.CUDNN_ATTR_REDUCTION_OPERATOR: be.CUDNN_REDUCE_TENSOR_ADD},
    D.CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATION_REDUCTION_XDESC: _t(1, [2, 3]),
        A.CUDNN_ATTR_OPERATION_REDUCTION_YDESC: _t(2, [2, 1]),
        A.CUDNN_ATTR_OPERATION_REDUCTION_DESC: desc(
            D.CUDNN_BACKEND_REDUCTION_DESCRIPTOR, {A.CUDNN_ATTR_REDUCTION_OPERATOR: be.CUDNN_REDUCE_TENSOR_ADD}
        ),
    },
    D.CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATION_GENSTATS_MODE: be.CUDNN_GENSTATS_SUM_SQSUM,
        A.CUDNN_ATTR_OPERATION_GENSTATS_XDESC: _t(1, [2, 3, 4, 4]),
        A.CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC: _t(2, [1, 3, 1, 1]),
        A.CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC: _t(3, [1, 3, 1, 1]),
    },
    D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_RESAMPLE_MODE: be.CUDNN_RESAMPLE_MAXPOOL,
        A.CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS: 2,
        A.CUDNN_ATTR_RESAMPLE_WINDOW_DIMS: [2, 2],
        A.CUDNN_ATTR_RESAMPLE_STRIDES: [2, 2],
        A.CUDNN_ATTR_RESAMPLE_PRE_PADDINGS: [0, 0],
        A.CUDNN_ATTR_RESAMPLE_POST_PADDINGS: [0, 0],
    },
    D.CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC: _t(1, [1, 2, 4, 4]),
        A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC: _t(2, [1, 2, 2, 2]),
        A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC: desc(
            D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR, RECIPES[D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR]()
        ),
    },
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR: lambda: _conv_op(
        "OPERATION_CONVOLUTION_FORWARD", ("X", "W", "Y"), ([1, 2, 4, 4], [3, 2, 3, 3], [1, 3, 4, 4])
    ),
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR: lambda: _conv_op(
        "OPERATION_CONVOLUTION_BWD_DATA", ("DY", "W", "DX"), ([1, 3, 4, 4], [3, 2, 3, 3], [1, 2, 4, 4])
    ),
    D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: lambda: _conv_op(
        "OPERATION_CONVOLUTION_BWD_FILTER", ("X", "DY", "DW"), ([1, 2, 4, 4], [1, 3, 4, 4], [3, 2, 3, 3])
    ),
    D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR: _norm_fwd,
    D.CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR: _norm_bwd,
    D.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_OPERATIONGRAPH_HANDLE: HANDLE,
        A.CUDNN_ATTR_OPERATIONGRAPH_OPS: [
            pointwise(be.CUDNN_POINTWISE_ADD, _t(1, [2, 3]), _t(3, [2, 3]), _t(2, [2, 3]))
        ],
    },
    D.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH: _graph(),
        A.CUDNN_ATTR_ENGINEHEUR_MODE: be.CUDNN_HEUR_MODE_A,
    },
    D.CUDNN_BACKEND_ENGINE_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH: _graph(),
        A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: 0,
    },
    D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: lambda: {A.CUDNN_ATTR_ENGINECFG_ENGINE: _engine()},
    D.CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE: be.CUDNN_KNOB_TYPE_KERNEL_CFG,
        A.CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE: 0,
    },
    D.CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR: dict,
    D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: HANDLE,
        A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: _cfg(),
    },
    D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: lambda: {
        A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: [1],
        A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: [0],
    },
}


def test_every_descriptor_type_has_a_recipe():
    assert set(RECIPES) == set(SCHEMA)


@pytest.mark.parametrize("kind", list(RECIPES), ids=lambda k: k.name)
def test_recipe_finalizes(kind):
    d = desc(kind, RECIPES[kind]())
    assert d.finalized and be.finalize.__name__


REQUIRED = [(k, a) for k in RECIPES for a, spec in SCHEMA[k].items() if spec.required]


@pytest.mark.parametrize("kind, attr", REQUIRED, ids=lambda v: v.name)
def test_finalize_names_a_missing_required_attribute(kind, attr):
    attrs = RECIPES[kind]()
    del attrs[attr]
    d = desc(kind, attrs, finalize=False)
    with pytest.raises(be.BackendError) as ei:
        be.finalize(d)
    err = ei.value
    assert (err.rule, err.attribute, err.status) == ("backend.required", attr.name, Status.CUDNN_STATUS_BAD_PARAM)
    assert kind.name in str(err) and f"set_attribute(desc, {attr.name}" in str(err), str(err)
    assert not d.finalized


def _sample(kind: D, attr: A, spec) -> tuple[T, object]:
    t = spec.types[0]
    if t in VALUE_ENUMS:
        value = list(VALUE_ENUMS[t])[0]
    elif t is T.CUDNN_TYPE_BACKEND_DESCRIPTOR:
        target = spec.points_at[0]
        value = desc(target, RECIPES[target]())
    else:
        value = {
            T.CUDNN_TYPE_INT64: 3,
            T.CUDNN_TYPE_INT32: 3,
            T.CUDNN_TYPE_FLOAT: 0.5,
            T.CUDNN_TYPE_DOUBLE: 0.5,
            T.CUDNN_TYPE_BOOLEAN: True,
            T.CUDNN_TYPE_VOID_PTR: 4096,
            T.CUDNN_TYPE_HANDLE: HANDLE,
            T.CUDNN_TYPE_CHAR: "{}",
        }[t]
    return t, ([value, value] if spec.many else value)


SETTABLE = [(k, a) for k in RECIPES for a, spec in SCHEMA[k].items() if spec.settable]


@pytest.mark.parametrize("kind, attr", SETTABLE, ids=lambda v: v.name)
def test_set_then_get_every_attribute(kind, attr):
    spec = SCHEMA[kind][attr]
    t, value = _sample(kind, attr, spec)
    d = be.create_descriptor(kind)
    assert be.set_attribute(d, attr, t, value) is Status.CUDNN_STATUS_SUCCESS
    got = be.get_attribute(d, attr, t)
    assert got == (value if spec.many else [value])
    if spec.many:
        assert be.get_attribute(d, attr, t, requested_count=1) == value[:1]
    else:
        with pytest.raises(be.BackendError) as ei:
            be.set_attribute(d, attr, t, [value, value])
        assert ei.value.rule == "backend.element_count"


READ_ONLY = [(k, a) for k in RECIPES for a, spec in SCHEMA[k].items() if not spec.settable]


@pytest.mark.parametrize("kind, attr", READ_ONLY, ids=lambda v: v.name)
def test_read_only_attributes(kind, attr):
    spec = SCHEMA[kind][attr]
    d = be.create_descriptor(kind)
    with pytest.raises(be.BackendError) as ei:
        be.set_attribute(d, attr, spec.types[0], 1)
    assert ei.value.rule == "backend.read_only"
    with pytest.raises(be.BackendError) as ei:
        be.get_attribute(d, attr, spec.types[0])
    assert ei.value.status is Status.CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED


def test_derived_attributes_after_finalize():
    graph = _graph()
    assert be.get_attribute(graph, A.CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, T.CUDNN_TYPE_INT64) == [1]
    engine = desc(
        D.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
        {A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH: graph, A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: 0},
    )
    (info,) = be.get_attribute(engine, A.CUDNN_ATTR_ENGINE_KNOB_INFO, T.CUDNN_TYPE_BACKEND_DESCRIPTOR)
    assert be.get_attribute(info, A.CUDNN_ATTR_KNOB_INFO_TYPE, T.CUDNN_TYPE_KNOB_TYPE) == [
        be.CUDNN_KNOB_TYPE_KERNEL_CFG
    ]
    assert [
        be.get_attribute(info, a, T.CUDNN_TYPE_INT64)[0]
        for a in (
            A.CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE,
            A.CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE,
            A.CUDNN_ATTR_KNOB_INFO_STRIDE,
        )
    ] == [0, 0, 1]
    assert be.CUDNN_NUMERICAL_NOTE_FP64_ACCUMULATION in be.get_attribute(
        engine, A.CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, T.CUDNN_TYPE_NUMERICAL_NOTE
    )
    assert be.CUDNN_BEHAVIOR_NOTE_HOST_EXECUTION in be.get_attribute(
        engine, A.CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, T.CUDNN_TYPE_BEHAVIOR_NOTE
    )
    assert be.get_attribute(engine, A.CUDNN_ATTR_ENGINE_LAYOUT_INFO, T.CUDNN_TYPE_BACKEND_DESCRIPTOR) == []
    heur = desc(
        D.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR,
        {A.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH: graph, A.CUDNN_ATTR_ENGINEHEUR_MODE: be.CUDNN_HEUR_MODE_FALLBACK},
    )
    receiver = be.create_descriptor(D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
    (cfg,) = be.get_attribute(
        heur, A.CUDNN_ATTR_ENGINEHEUR_RESULTS, T.CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, into=[receiver]
    )
    assert cfg is receiver and receiver.finalized
    assert be.get_attribute(cfg, A.CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, T.CUDNN_TYPE_INT64) == [0]
    (eng,) = be.get_attribute(cfg, A.CUDNN_ATTR_ENGINECFG_ENGINE, T.CUDNN_TYPE_BACKEND_DESCRIPTOR)
    assert be.get_attribute(eng, A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX, T.CUDNN_TYPE_INT64) == [0]
    assert be.get_attribute(cfg, A.CUDNN_ATTR_ENGINECFG_INTERMEDIATE_INFO, T.CUDNN_TYPE_BACKEND_DESCRIPTOR) == []
    with pytest.raises(be.BackendError, match="cannot receive"):
        be.get_attribute(
            heur,
            A.CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T.CUDNN_TYPE_BACKEND_DESCRIPTOR,
            into=[be.create_descriptor(D.CUDNN_BACKEND_TENSOR_DESCRIPTOR)],
        )


def test_set_attribute_refusals():
    t = be.create_descriptor(D.CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    cases = [
        (
            (t, A.CUDNN_ATTR_CONVOLUTION_COMP_TYPE, T.CUDNN_TYPE_DATA_TYPE, F32),
            "backend.attribute_name",
            Status.CUDNN_STATUS_BAD_PARAM,
            "its attributes are",
        ),
        (
            (t, A.CUDNN_ATTR_TENSOR_DIMENSIONS, T.CUDNN_TYPE_INT32, [2]),
            "backend.attribute_type",
            Status.CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE,
            "CUDNN_TYPE_INT64",
        ),
        (
            (t, A.CUDNN_ATTR_TENSOR_DATA_TYPE, T.CUDNN_TYPE_DATA_TYPE, 3),
            "backend.attribute_value",
            Status.CUDNN_STATUS_BAD_PARAM,
            "cudnnDataType_t",
        ),
        (
            (t, A.CUDNN_ATTR_TENSOR_DIMENSIONS, T.CUDNN_TYPE_INT64, [2.5]),
            "backend.attribute_value",
            Status.CUDNN_STATUS_BAD_PARAM,
            "ints",
        ),
        (
            (t, A.CUDNN_ATTR_TENSOR_IS_VIRTUAL, T.CUDNN_TYPE_BOOLEAN, 1),
            "backend.attribute_value",
            Status.CUDNN_STATUS_BAD_PARAM,
            "True or False",
        ),
        (
            (t, A.CUDNN_ATTR_TENSOR_DIMENSIONS, T.CUDNN_TYPE_INT64, []),
            "backend.element_count",
            Status.CUDNN_STATUS_BAD_PARAM,
            "non-empty",
        ),
        (
            (t, "CUDNN_ATTR_TENSOR_DIMENSIONS", T.CUDNN_TYPE_INT64, [2]),
            "backend.attribute_name",
            Status.CUDNN_STATUS_BAD_PARAM,
            "AttributeName",
        ),
    ]
    for args, rule, status, needle in cases:
        with pytest.raises(be.BackendError) as ei:
            be.set_attribute(*args)
        assert (ei.value.rule, ei.value.status) == (rule, status) and needle in str(ei.value), str(ei.value)
        assert "CUDNN_BACKEND_TENSOR_DESCRIPTOR" in str(ei.value) and "What to do" in str(ei.value)
    op = be.create_descriptor(D.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)
    open_tensor = tensor(5, [2, 2], finalize=False)
    with pytest.raises(be.BackendError) as ei:
        be.set_attribute(op, A.CUDNN_ATTR_OPERATION_MATMUL_ADESC, T.CUDNN_TYPE_BACKEND_DESCRIPTOR, open_tensor)
    assert ei.value.status is Status.CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED and "finalize()" in str(ei.value)
    with pytest.raises(be.BackendError, match="takes a CUDNN_BACKEND_TENSOR_DESCRIPTOR"):
        be.set_attribute(op, A.CUDNN_ATTR_OPERATION_MATMUL_ADESC, T.CUDNN_TYPE_BACKEND_DESCRIPTOR, conv_desc())
    done = tensor(6, [2, 2])
    with pytest.raises(be.BackendError) as ei:
        be.set_attribute(done, A.CUDNN_ATTR_TENSOR_UNIQUE_ID, T.CUDNN_TYPE_INT64, 9)
    assert ei.value.rule == "backend.finalized"
    with pytest.raises(be.BackendError, match="already finalized"):
        be.finalize(done)
    with pytest.raises(be.BackendError, match="is not set"):
        be.get_attribute(done, A.CUDNN_ATTR_TENSOR_VECTOR_COUNT, T.CUDNN_TYPE_INT64)
    assert be.destroy_descriptor(done) is Status.CUDNN_STATUS_SUCCESS
    with pytest.raises(be.BackendError, match="destroyed"):
        be.get_attribute(done, A.CUDNN_ATTR_TENSOR_UNIQUE_ID, T.CUDNN_TYPE_INT64)
    with pytest.raises(be.BackendError, match="destroyed"):
        be.set_attribute(op, A.CUDNN_ATTR_OPERATION_MATMUL_ADESC, T.CUDNN_TYPE_BACKEND_DESCRIPTOR, done)


def test_create_descriptor_refusals():
    with pytest.raises(be.BackendError, match="not a cudnnBackendDescriptorType_t"):
        be.create_descriptor("CUDNN_BACKEND_TENSOR_DESCRIPTOR")
    with pytest.raises(be.BackendError) as ei:
        be.create_descriptor(D.CUDNN_BACKEND_RNG_DESCRIPTOR)
    assert ei.value.status is Status.CUDNN_STATUS_NOT_SUPPORTED and "implemented:" in ei.value.hint


@pytest.mark.parametrize(
    "change, attr, rule",
    [
        ({A.CUDNN_ATTR_TENSOR_STRIDES: [1]}, A.CUDNN_ATTR_TENSOR_STRIDES, "tensor.stride_rank"),
        ({A.CUDNN_ATTR_TENSOR_DIMENSIONS: [0, 3]}, A.CUDNN_ATTR_TENSOR_DIMENSIONS, "tensor.dim"),
        ({A.CUDNN_ATTR_TENSOR_STRIDES: [3, -1]}, A.CUDNN_ATTR_TENSOR_STRIDES, "tensor.stride"),
        ({A.CUDNN_ATTR_TENSOR_UNIQUE_ID: -4}, A.CUDNN_ATTR_TENSOR_UNIQUE_ID, "tensor.uid"),
        ({A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT: 6}, A.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, "tensor.alignment"),
        ({A.CUDNN_ATTR_TENSOR_IS_BY_VALUE: True}, A.CUDNN_ATTR_TENSOR_IS_BY_VALUE, "tensor.pass_by_value"),
        ({A.CUDNN_ATTR_TENSOR_VECTOR_COUNT: 4}, A.CUDNN_ATTR_TENSOR_VECTOR_COUNT, "tensor.vectorized"),
        (
            {A.CUDNN_ATTR_TENSOR_REORDERING_MODE: be.CUDNN_TENSOR_REORDERING_INT8x32},
            A.CUDNN_ATTR_TENSOR_REORDERING_MODE,
            "tensor.reordering",
        ),
        ({A.CUDNN_ATTR_TENSOR_DATA_TYPE: be.CUDNN_DATA_INT8x32}, A.CUDNN_ATTR_TENSOR_DATA_TYPE, "backend.data_type"),
    ],
)
def test_tensor_finalize_checks(change, attr, rule):
    d = desc(D.CUDNN_BACKEND_TENSOR_DESCRIPTOR, {**RECIPES[D.CUDNN_BACKEND_TENSOR_DESCRIPTOR](), **change}, False)
    with pytest.raises(be.BackendError) as ei:
        be.finalize(d)
    assert (ei.value.rule, ei.value.attribute) == (rule, attr.name), str(ei.value)


@pytest.mark.parametrize(
    "kind, change, attr, rule",
    [
        (
            D.CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR,
            {A.CUDNN_ATTR_CONVOLUTION_DILATIONS: [1]},
            A.CUDNN_ATTR_CONVOLUTION_DILATIONS,
            "backend.spatial_dims",
        ),
        (
            D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR,
            {A.CUDNN_ATTR_RESAMPLE_PADDING_MODE: be.CUDNN_EDGE_VAL_PAD},
            A.CUDNN_ATTR_RESAMPLE_PADDING_MODE,
            "resample.padding",
        ),
        (
            D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR,
            {A.CUDNN_ATTR_RESAMPLE_MODE: be.CUDNN_RESAMPLE_BILINEAR},
            A.CUDNN_ATTR_RESAMPLE_MODE,
            "resample.mode",
        ),
        (
            D.CUDNN_BACKEND_MATMUL_DESCRIPTOR,
            {A.CUDNN_ATTR_MATMUL_PADDING_VALUE: 1.0},
            A.CUDNN_ATTR_MATMUL_PADDING_VALUE,
            "matmul.padding",
        ),
    ],
)
def test_attribute_descriptor_finalize_checks(kind, change, attr, rule):
    d = desc(kind, {**RECIPES[kind](), **change}, False)
    with pytest.raises(be.BackendError) as ei:
        be.finalize(d)
    assert (ei.value.rule, ei.value.attribute) == (rule, attr.name), str(ei.value)


def test_pointwise_operation_needs_its_modes_operands():
    attrs = RECIPES[D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR]()
    del attrs[A.CUDNN_ATTR_OPERATION_POINTWISE_BDESC]
    d = desc(D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, attrs, False)
    with pytest.raises(be.BackendError, match="CUDNN_POINTWISE_ADD|ADD needs") as ei:
        be.finalize(d)
    assert ei.value.attribute == "CUDNN_ATTR_OPERATION_POINTWISE_BDESC"


def test_operation_graph_errors_name_the_operation_and_attribute():
    bad_w = _conv_op("OPERATION_CONVOLUTION_FORWARD", ("X", "W", "Y"), ([1, 2, 4, 4], [3, 5, 3, 3], [1, 3, 4, 4]))
    op = desc(D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, bad_w)
    with pytest.raises(be.BackendError) as ei:
        op_graph(HANDLE, [op])
    err = ei.value
    assert err.descriptor == op.label() and err.attribute == "CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W"
    assert err.rule == "conv.channels" and err.status is Status.CUDNN_STATUS_BAD_PARAM and err.hint
    one = pointwise(be.CUDNN_POINTWISE_ADD, _t(1, [2, 3]), _t(3, [2, 3]), _t(2, [2, 3]))
    two = pointwise(be.CUDNN_POINTWISE_MUL, _t(1, [2, 3]), _t(3, [2, 3]), _t(2, [2, 3]))
    with pytest.raises(be.BackendError, match="output of two operations") as ei:
        op_graph(HANDLE, [one, two])
    clash = pointwise(be.CUDNN_POINTWISE_ADD, _t(1, [2, 3]), _t(3, [2, 3]), _t(1, [3, 2]))
    with pytest.raises(be.BackendError, match="two tensor descriptors that differ"):
        op_graph(HANDLE, [clash])
    with pytest.raises(be.BackendError) as ei:
        desc(
            D.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
            {A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH: _graph(), A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: 4},
        )
    assert ei.value.status is Status.CUDNN_STATUS_NOT_SUPPORTED and ei.value.rule == "cudnn.engine_index"


def test_c_names_are_exported():
    names = [m for kind in (D, A, T, Status) for m in kind]
    assert all(getattr(be, m.name) is m for m in names)
    assert be.CUDNN_DATA_HALF in be.cudnnDataType_t and isinstance(be.CUDNN_STATUS_SUCCESS, enum.Enum)
    assert repr(be.CUDNN_ATTR_TENSOR_DIMENSIONS) == "CUDNN_ATTR_TENSOR_DIMENSIONS"
