"""opgraph.backend: every operation descriptor executed against PyTorch in float64 (the reference
engine on the CPU; the default engines on the GPU tier), alpha/beta as host values and as device
scalars, engines and knobs, plans from their JSON, variant-pack refusals."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph.backend as be
from opgraph.backend import AttributeName as A
from opgraph.backend import AttributeType as T
from opgraph.backend import DescriptorType as D
from opgraph.backend import Status

from ..helpers import requires_cuda
from .helpers import conv_desc, desc, execute, nan, op_graph, plan_for, pointwise, run, tensor

torch = pytest.importorskip("torch")
HANDLE = be.create_handle("cpu")
F32 = be.CUDNN_DATA_FLOAT


def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol)


def _conv_op(kind, prefix, tensors, alpha=None, beta=None, cd=None):
    attrs = {A[f"CUDNN_ATTR_{prefix}_{r}"]: t for r, t in tensors.items()}
    attrs[A[f"CUDNN_ATTR_{prefix}_CONV_DESC"]] = cd or conv_desc()
    for name, value in (("ALPHA", alpha), ("BETA", beta)):
        if value is not None:
            attrs[A[f"CUDNN_ATTR_{prefix}_{name}"]] = value
    return desc(kind, attrs)


def test_conv_forward_with_alpha_and_beta_over_y(rng):
    """Y = 2 * conv(X, W) + 0.5 * Y: beta reads Y's old value, bound to Y's own buffer."""
    x, w, y0 = _r(rng, 2, 3, 6, 6), _r(rng, 4, 3, 3, 3), _r(rng, 2, 4, 6, 6)
    op = _conv_op(
        D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        "OPERATION_CONVOLUTION_FORWARD",
        {"X": tensor(1, [2, 3, 6, 6]), "W": tensor(2, [4, 3, 3, 3]), "Y": tensor(3, [2, 4, 6, 6])},
        alpha=(T.CUDNN_TYPE_DOUBLE, 2.0),
        beta=(T.CUDNN_TYPE_FLOAT, 0.5),
    )
    y = y0.copy()
    run(HANDLE, [op], {1: x, 2: w, 3: y})
    conv = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    _close(y, 2 * conv + 0.5 * y0)


def test_conv_backward_data_and_filter(rng):
    x, w, dy = _r(rng, 2, 3, 7, 7), _r(rng, 4, 3, 3, 3), _r(rng, 2, 4, 4, 4)
    cd = conv_desc(pad=1, stride=2)
    dgrad = _conv_op(
        D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
        "OPERATION_CONVOLUTION_BWD_DATA",
        {"DY": tensor(3, [2, 4, 4, 4]), "W": tensor(2, [4, 3, 3, 3]), "DX": tensor(4, [2, 3, 7, 7])},
        cd=cd,
    )
    wgrad = _conv_op(
        D.CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
        "OPERATION_CONVOLUTION_BWD_FILTER",
        {"X": tensor(1, [2, 3, 7, 7]), "DY": tensor(3, [2, 4, 4, 4]), "DW": tensor(5, [4, 3, 3, 3])},
        cd=cd,
    )
    dx, dw = nan(2, 3, 7, 7), nan(4, 3, 3, 3)
    run(HANDLE, [dgrad, wgrad], {1: x, 2: w, 3: dy, 4: dx, 5: dw})
    tx, tw, tdy = (torch.from_numpy(a).double() for a in (x, w, dy))
    _close(dx, torch.nn.grad.conv2d_input(tx.shape, tw, tdy, stride=2, padding=1))
    _close(dw, torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, stride=2, padding=1))


def test_pointwise_modes_alphas_and_backward(rng):
    a, b, m, dy = _r(rng, 3, 5), _r(rng, 1, 5), rng.random((3, 5)) < 0.5, _r(rng, 3, 5)
    ta, tb = tensor(1, [3, 5]), tensor(2, [1, 5])
    tm = tensor(3, [3, 5], dtype=be.CUDNN_DATA_BOOLEAN)
    s1, s2, y1, y2, _ = (
        tensor(u, [3, 5], virtual=v) for u, v in ((10, True), (11, False), (12, False), (13, False), (14, False))
    )
    add = pointwise(
        be.CUDNN_POINTWISE_ADD,
        ta,
        s1,
        tb,
        CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1=0.5,
        CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2=(T.CUDNN_TYPE_DOUBLE, -2.0),
    )
    relu = pointwise(
        be.CUDNN_POINTWISE_RELU_FWD,
        s1,
        s2,
        CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP=-0.25,
        CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP=0.75,
    )
    select = pointwise(be.CUDNN_POINTWISE_BINARY_SELECT, ta, y1, s2, t=tm)
    drelu = desc(
        D.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
        {
            A.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR: desc(
                D.CUDNN_BACKEND_POINTWISE_DESCRIPTOR, {A.CUDNN_ATTR_POINTWISE_MODE: be.CUDNN_POINTWISE_RELU_BWD}
            ),
            A.CUDNN_ATTR_OPERATION_POINTWISE_DYDESC: tensor(4, [3, 5]),
            A.CUDNN_ATTR_OPERATION_POINTWISE_XDESC: ta,
            A.CUDNN_ATTR_OPERATION_POINTWISE_DXDESC: y2,
        },
    )
    index = pointwise(
        be.CUDNN_POINTWISE_GEN_INDEX, ta, tensor(14, [3, 5], dtype=be.CUDNN_DATA_INT32), CUDNN_ATTR_POINTWISE_AXIS=1
    )
    out = {11: nan(3, 5), 12: nan(3, 5), 13: nan(3, 5), 14: np.zeros((3, 5), np.int32)}
    run(HANDLE, [add, relu, select, drelu, index], {1: a, 2: b, 3: m, 4: dy, **out})
    s = np.clip(0.5 * a.astype(np.float64) - 2.0 * b, -0.25, 0.75)
    _close(out[11], s)
    _close(out[12], np.where(m, a, s))
    _close(out[13], np.where(a > 0, dy, 0.0))
    np.testing.assert_array_equal(out[14], np.broadcast_to(np.arange(5), (3, 5)))


def test_matmul_reduction_genstats_resample(rng):
    a, b, x = _r(rng, 2, 4, 6), _r(rng, 1, 6, 3), _r(rng, 2, 3, 6, 6)
    mm = desc(
        D.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
        {
            A.CUDNN_ATTR_OPERATION_MATMUL_ADESC: tensor(1, [2, 4, 6]),
            A.CUDNN_ATTR_OPERATION_MATMUL_BDESC: tensor(2, [1, 6, 3]),
            A.CUDNN_ATTR_OPERATION_MATMUL_CDESC: tensor(3, [2, 4, 3]),
            A.CUDNN_ATTR_OPERATION_MATMUL_DESC: desc(
                D.CUDNN_BACKEND_MATMUL_DESCRIPTOR, {A.CUDNN_ATTR_MATMUL_COMP_TYPE: F32}
            ),
        },
    )
    red = desc(
        D.CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
        {
            A.CUDNN_ATTR_OPERATION_REDUCTION_XDESC: tensor(4, [2, 3, 6, 6]),
            A.CUDNN_ATTR_OPERATION_REDUCTION_YDESC: tensor(5, [2, 1, 6, 6]),
            A.CUDNN_ATTR_OPERATION_REDUCTION_DESC: desc(
                D.CUDNN_BACKEND_REDUCTION_DESCRIPTOR, {A.CUDNN_ATTR_REDUCTION_OPERATOR: be.CUDNN_REDUCE_TENSOR_MAX}
            ),
        },
    )
    stats = desc(
        D.CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR,
        {
            A.CUDNN_ATTR_OPERATION_GENSTATS_MODE: be.CUDNN_GENSTATS_SUM_SQSUM,
            A.CUDNN_ATTR_OPERATION_GENSTATS_XDESC: tensor(4, [2, 3, 6, 6]),
            A.CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC: tensor(6, [1, 3, 1, 1]),
            A.CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC: tensor(7, [1, 3, 1, 1]),
        },
    )
    rs = desc(
        D.CUDNN_BACKEND_RESAMPLE_DESCRIPTOR,
        {
            A.CUDNN_ATTR_RESAMPLE_MODE: be.CUDNN_RESAMPLE_AVGPOOL_EXCLUDE_PADDING,
            A.CUDNN_ATTR_RESAMPLE_SPATIAL_DIMS: 2,
            A.CUDNN_ATTR_RESAMPLE_WINDOW_DIMS: [2, 2],
            A.CUDNN_ATTR_RESAMPLE_STRIDES: [2, 2],
            A.CUDNN_ATTR_RESAMPLE_PRE_PADDINGS: [0, 0],
            A.CUDNN_ATTR_RESAMPLE_POST_PADDINGS: [0, 0],
        },
    )
    pool = desc(
        D.CUDNN_BACKEND_OPERATION_RESAMPLE_FWD_DESCRIPTOR,
        {
            A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_XDESC: tensor(4, [2, 3, 6, 6]),
            A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_YDESC: tensor(8, [2, 3, 3, 3]),
            A.CUDNN_ATTR_OPERATION_RESAMPLE_FWD_DESC: rs,
        },
    )
    out = {3: nan(2, 4, 3), 5: nan(2, 1, 6, 6), 6: nan(1, 3, 1, 1), 7: nan(1, 3, 1, 1), 8: nan(2, 3, 3, 3)}
    run(HANDLE, [mm, red, stats, pool], {1: a, 2: b, 4: x, **out})
    xd = x.astype(np.float64)
    _close(out[3], a.astype(np.float64) @ b)
    _close(out[5], xd.max(1, keepdims=True))
    _close(out[6], xd.sum((0, 2, 3), keepdims=True))
    _close(out[7], (xd * xd).sum((0, 2, 3), keepdims=True))
    _close(out[8], xd.reshape(2, 3, 3, 2, 3, 2).mean((3, 5)))


def _norm(kind, mode, tensors, phase=None):
    prefix = "OPERATION_NORM_FWD" if kind is D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR else "OPERATION_NORM_BWD"
    attrs = {A[f"CUDNN_ATTR_{prefix}_MODE"]: mode, **{A[f"CUDNN_ATTR_{prefix}_{r}"]: t for r, t in tensors.items()}}
    if phase is not None:
        attrs[A.CUDNN_ATTR_OPERATION_NORM_FWD_PHASE] = phase
    return desc(kind, attrs)


def test_batchnorm_training_running_stats_in_place_and_backward(rng):
    x, s, b = _r(rng, 4, 3, 5, 5), _r(rng, 1, 3, 1, 1), _r(rng, 1, 3, 1, 1)
    rm, rv = _r(rng, 1, 3, 1, 1), np.abs(_r(rng, 1, 3, 1, 1)) + 0.5
    c = [1, 3, 1, 1]
    fwd = _norm(
        D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR,
        be.CUDNN_BATCH_NORM,
        {
            "XDESC": tensor(1, [4, 3, 5, 5]),
            "SCALE_DESC": tensor(2, c),
            "BIAS_DESC": tensor(3, c),
            "EPSILON_DESC": tensor(4, [1, 1, 1, 1], by_value=True),
            "EXP_AVG_FACTOR_DESC": tensor(5, [1, 1, 1, 1], by_value=True),
            "INPUT_RUNNING_MEAN_DESC": tensor(6, c),
            "INPUT_RUNNING_VAR_DESC": tensor(7, c),
            "OUTPUT_RUNNING_MEAN_DESC": tensor(8, c),
            "OUTPUT_RUNNING_VAR_DESC": tensor(9, c),
            "YDESC": tensor(10, [4, 3, 5, 5]),
            "MEAN_DESC": tensor(11, c),
            "INV_VARIANCE_DESC": tensor(12, c),
        },
        be.CUDNN_NORM_FWD_TRAINING,
    )
    want_rm, want_rv = torch.from_numpy(rm).double().reshape(-1), torch.from_numpy(rv).double().reshape(-1)
    tx = torch.from_numpy(x).double().requires_grad_()
    want_y = torch.nn.functional.batch_norm(
        tx,
        want_rm,
        want_rv,
        torch.from_numpy(s).double().reshape(-1),
        torch.from_numpy(b).double().reshape(-1),
        training=True,
        momentum=0.1,
        eps=1e-5,
    )
    y, mean, inv = nan(4, 3, 5, 5), nan(*c), nan(*c)
    run(
        HANDLE,
        [fwd],
        {
            1: x,
            2: s,
            3: b,
            4: np.float32([1e-5]),
            5: np.float32([0.1]),
            6: rm,
            7: rv,
            8: rm,
            9: rv,
            10: y,
            11: mean,
            12: inv,
        },
    )
    _close(y, want_y.detach())
    _close(rm.reshape(-1), want_rm)
    _close(rv.reshape(-1), want_rv)
    dy = _r(rng, 4, 3, 5, 5)
    want_y.backward(torch.from_numpy(dy).double())
    bwd = _norm(
        D.CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR,
        be.CUDNN_BATCH_NORM,
        {
            "XDESC": tensor(1, [4, 3, 5, 5]),
            "DYDESC": tensor(2, [4, 3, 5, 5]),
            "SCALE_DESC": tensor(3, c),
            "MEAN_DESC": tensor(4, c),
            "INV_VARIANCE_DESC": tensor(5, c),
            "DXDESC": tensor(6, [4, 3, 5, 5]),
            "DSCALE_DESC": tensor(7, c),
            "DBIAS_DESC": tensor(8, c),
        },
    )
    dx, ds, db = nan(4, 3, 5, 5), nan(*c), nan(*c)
    run(HANDLE, [bwd], {1: x, 2: dy, 3: s, 4: mean, 5: inv, 6: dx, 7: ds, 8: db})
    _close(dx, tx.grad)
    _close(db, dy.astype(np.float64).sum((0, 2, 3), keepdims=True))


@pytest.mark.parametrize("mode", ["LAYER", "RMS", "INSTANCE"])
def test_norm_forward_and_backward(rng, mode):
    x = _r(rng, 2, 4, 3, 3)
    per = [1, 4, 3, 3] if mode != "INSTANCE" else [1, 4, 1, 1]
    stats = [2, 1, 1, 1] if mode != "INSTANCE" else [2, 4, 1, 1]
    s, b = _r(rng, *per), _r(rng, *per)
    m = getattr(be, f"CUDNN_{mode}_NORM")
    tensors = {
        "XDESC": tensor(1, [2, 4, 3, 3]),
        "SCALE_DESC": tensor(2, per),
        "BIAS_DESC": tensor(3, per),
        "EPSILON_DESC": tensor(4, [1, 1, 1, 1], by_value=True),
        "YDESC": tensor(5, [2, 4, 3, 3]),
        "INV_VARIANCE_DESC": tensor(7, stats),
    }
    if mode != "RMS":
        tensors["MEAN_DESC"] = tensor(6, stats)
    fwd = _norm(D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR, m, tensors, be.CUDNN_NORM_FWD_TRAINING)
    y, mean, inv = nan(2, 4, 3, 3), nan(*stats), nan(*stats)
    run(HANDLE, [fwd], {1: x, 2: s, 3: b, 4: np.float32([1e-5]), 5: y, 7: inv, **({6: mean} if mode != "RMS" else {})})
    xd = torch.from_numpy(x).double().requires_grad_()
    axes = (1, 2, 3) if mode != "INSTANCE" else (2, 3)
    if mode == "RMS":
        want = xd * torch.rsqrt((xd * xd).mean(axes, keepdim=True) + 1e-5) * torch.from_numpy(s) + torch.from_numpy(b)
    else:
        mu, var = xd.mean(axes, keepdim=True), xd.var(axes, keepdim=True, unbiased=False)
        want = (xd - mu) * torch.rsqrt(var + 1e-5) * torch.from_numpy(s) + torch.from_numpy(b)
    _close(y, want.detach())
    dy = _r(rng, 2, 4, 3, 3)
    want.backward(torch.from_numpy(dy).double())
    bt = {
        "XDESC": tensor(1, [2, 4, 3, 3]),
        "DYDESC": tensor(2, [2, 4, 3, 3]),
        "SCALE_DESC": tensor(3, per),
        "INV_VARIANCE_DESC": tensor(5, stats),
        "DXDESC": tensor(6, [2, 4, 3, 3]),
        "DSCALE_DESC": tensor(7, per),
        "DBIAS_DESC": tensor(8, per),
    }
    if mode != "RMS":
        bt["MEAN_DESC"] = tensor(4, stats)
    bwd = _norm(D.CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR, m, bt)
    dx, ds, db = nan(2, 4, 3, 3), nan(*per), nan(*per)
    run(HANDLE, [bwd], {1: x, 2: dy, 3: s, 5: inv, 6: dx, 7: ds, 8: db, **({4: mean} if mode != "RMS" else {})})
    _close(dx, xd.grad)


def test_batchnorm_inference(rng):
    x, mean, inv, s, b = (
        _r(rng, 2, 3, 4, 4),
        _r(rng, 1, 3, 1, 1),
        np.abs(_r(rng, 1, 3, 1, 1)),
        _r(rng, 1, 3, 1, 1),
        _r(rng, 1, 3, 1, 1),
    )
    c = [1, 3, 1, 1]
    op = _norm(
        D.CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR,
        be.CUDNN_BATCH_NORM,
        {
            "XDESC": tensor(1, [2, 3, 4, 4]),
            "MEAN_DESC": tensor(2, c),
            "INV_VARIANCE_DESC": tensor(3, c),
            "SCALE_DESC": tensor(4, c),
            "BIAS_DESC": tensor(5, c),
            "YDESC": tensor(6, [2, 3, 4, 4]),
        },
        be.CUDNN_NORM_FWD_INFERENCE,
    )
    y = nan(2, 3, 4, 4)
    run(HANDLE, [op], {1: x, 2: mean, 3: inv, 4: s, 5: b, 6: y})
    _close(y, (x.astype(np.float64) - mean) * inv * s + b)


def test_device_scalar_alphas(rng):
    """alpha from a 1-element tensor descriptor (bound by UID) and from a pointer (the backend binds it):
    changing their values needs no new plan."""
    x, w = _r(rng, 1, 2, 5, 5), _r(rng, 3, 2, 3, 3)
    lr = np.array([0.5], np.float32)
    op = _conv_op(
        D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        "OPERATION_CONVOLUTION_FORWARD",
        {"X": tensor(1, [1, 2, 5, 5]), "W": tensor(2, [3, 2, 3, 3]), "Y": tensor(3, [1, 3, 5, 5])},
        alpha=(T.CUDNN_TYPE_BACKEND_DESCRIPTOR, tensor(9, [1, 1, 1, 1])),
        beta=(T.CUDNN_TYPE_VOID_PTR, lr),
    )
    plan = plan_for(HANDLE, op_graph(HANDLE, [op]))
    conv = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1).numpy()
    y0 = _r(rng, 1, 3, 5, 5)
    for alpha, beta in ((2.0, 0.5), (-1.0, 0.25)):
        lr[0] = beta
        y = y0.copy()
        execute(HANDLE, plan, {1: x, 2: w, 3: y, 9: np.array([[[[alpha]]]], np.float32)})
        _close(y, alpha * conv + beta * y0)


def test_engine_knob_path_and_json_plans(rng):
    a, b = _r(rng, 3, 4), _r(rng, 3, 4)
    graph = op_graph(
        HANDLE, [pointwise(be.CUDNN_POINTWISE_MUL, tensor(1, [3, 4]), tensor(3, [3, 4]), tensor(2, [3, 4]))]
    )
    engine = desc(
        D.CUDNN_BACKEND_ENGINE_DESCRIPTOR,
        {A.CUDNN_ATTR_ENGINE_OPERATION_GRAPH: graph, A.CUDNN_ATTR_ENGINE_GLOBAL_INDEX: 0},
    )
    knob = desc(
        D.CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        {A.CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE: be.CUDNN_KNOB_TYPE_KERNEL_CFG, A.CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE: 0},
    )
    cfg = desc(
        D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
        {A.CUDNN_ATTR_ENGINECFG_ENGINE: engine, A.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: [knob]},
    )
    plan = desc(
        D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
        {A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: HANDLE, A.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG: cfg},
    )
    y = nan(3, 4)
    execute(HANDLE, plan, {1: a, 2: b, 3: y})
    _close(y, a.astype(np.float64) * b)
    (text,) = be.get_attribute(plan, A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, T.CUDNN_TYPE_CHAR)
    again = desc(
        D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
        {A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: HANDLE, A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: text},
    )
    y2 = nan(3, 4)
    execute(HANDLE, again, {1: a, 2: b, 3: y2})
    np.testing.assert_array_equal(y2, y)
    assert be.get_attribute(again, A.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, T.CUDNN_TYPE_INT64) == [0]
    bad_knob = desc(
        D.CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        {A.CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE: be.CUDNN_KNOB_TYPE_SPLIT_K, A.CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE: 2},
    )
    with pytest.raises(be.BackendError, match="CUDNN_KNOB_TYPE_SPLIT_K") as ei:
        desc(
            D.CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
            {A.CUDNN_ATTR_ENGINECFG_ENGINE: engine, A.CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: [bad_knob]},
        )
    assert ei.value.status is Status.CUDNN_STATUS_NOT_SUPPORTED
    with pytest.raises(be.BackendError, match="neither"):
        desc(D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, {A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: HANDLE})
    with pytest.raises(be.BackendError) as ei:
        desc(
            D.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
            {A.CUDNN_ATTR_EXECUTION_PLAN_HANDLE: HANDLE, A.CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: "{nope"},
        )
    assert ei.value.attribute == "CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION"


def test_variant_pack_refusals_write_nothing(rng):
    a, b = _r(rng, 3, 4), _r(rng, 3, 4)
    graph = op_graph(
        HANDLE, [pointwise(be.CUDNN_POINTWISE_SUB, tensor(1, [3, 4]), tensor(3, [3, 4]), tensor(2, [3, 4]))]
    )
    plan = plan_for(HANDLE, graph)
    y = nan(3, 4)
    with pytest.raises(be.BackendError) as ei:
        desc(
            D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
            {A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: [1, 2], A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: [a]},
        )
    assert ei.value.rule == "backend.variant_pack"
    with pytest.raises(be.BackendError) as ei:
        desc(
            D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
            {A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: [1, 1], A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: [a, b]},
        )
    assert ei.value.status is Status.CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES
    with pytest.raises(be.BackendError) as ei:
        execute(HANDLE, plan, {1: a, 3: y})
    assert ei.value.rule == "pack.missing" and "uid 2" in str(ei.value) and np.isnan(y).all()
    with pytest.raises(be.BackendError) as ei:
        execute(HANDLE, plan, {1: a, 2: a.ctypes.data, 3: y})
    assert ei.value.rule == "backend.host_pointer" and np.isnan(y).all()
    with pytest.raises(be.BackendError) as ei:
        execute(HANDLE, plan, {1: a, 2: b[:, :3], 3: y})
    assert ei.value.rule == "pack.shape" and ei.value.attribute == "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"
    with pytest.raises(be.BackendError, match="finalized CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR"):
        be.execute(HANDLE, graph, plan)
    with pytest.raises(be.BackendError, match="CUDA graphs need a plan"):
        pack = desc(
            D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
            {A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: [1, 2, 3], A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: [a, b, y]},
        )
        be.populate_cuda_graph(HANDLE, plan, pack)


@pytest.mark.gpu
@requires_cuda
def test_gpu_device_pointers_workspace_and_cuda_graphs(rng):
    handle = be.create_handle("cuda")
    nhwc = lambda n, c, h, w: [h * w * c, 1, w * c, c]
    half = be.CUDNN_DATA_HALF
    x_d, w_d, y_d = (
        tensor(u, d, nhwc(*d), dtype=half) for u, d in ((1, [2, 16, 8, 8]), (2, [32, 16, 3, 3]), (3, [2, 32, 8, 8]))
    )
    b_d = tensor(4, [1, 32, 1, 1], dtype=half)
    conv_out = tensor(5, [2, 32, 8, 8], nhwc(2, 32, 8, 8), virtual=True)
    fprop = _conv_op(
        D.CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
        "OPERATION_CONVOLUTION_FORWARD",
        {"X": x_d, "W": w_d, "Y": conv_out},
    )
    relu_in = tensor(6, [2, 32, 8, 8], nhwc(2, 32, 8, 8), virtual=True)
    ops = [
        fprop,
        pointwise(be.CUDNN_POINTWISE_ADD, conv_out, relu_in, b_d),
        pointwise(be.CUDNN_POINTWISE_RELU_FWD, relu_in, y_d),
    ]
    plan = plan_for(handle, op_graph(handle, ops))
    ws_size = be.get_attribute(plan, A.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, T.CUDNN_TYPE_INT64)[0]
    x = torch.randn(2, 16, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    w = torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    b = torch.randn(1, 32, 1, 1, device="cuda", dtype=torch.float16)
    y = torch.empty(2, 32, 8, 8, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    ws = torch.empty(max(ws_size, 1), device="cuda", dtype=torch.uint8)
    execute(handle, plan, {1: x.data_ptr(), 2: w.data_ptr(), 3: y.data_ptr(), 4: b.data_ptr()}, ws.data_ptr())
    torch.cuda.synchronize()
    want = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double().reshape(-1), padding=1))
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=5e-2)
    y2 = torch.empty_like(y)
    pack = desc(
        D.CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR,
        {
            A.CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS: [1, 2, 3, 4],
            A.CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS: [x, w, y2, b],
            A.CUDNN_ATTR_VARIANT_PACK_WORKSPACE: ws,
        },
    )
    graph = be.populate_cuda_graph(handle, plan, pack)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y2, y)
