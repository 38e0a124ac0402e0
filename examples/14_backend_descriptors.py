"""conv + bias + relu through the backend descriptor API, step by step as cuDNN's developer guide builds
it in C (tensors, convolution, operations, operation graph, heuristics, engine config, execution plan,
variant pack, execute), with `from opgraph.backend import *` standing in for `#include <cudnn.h>`.
Runs on the GPU when there is one, else on the CPU through the reference engine. Each step prints what
it did; a deliberate mistake at the end shows what a refusal says instead of CUDNN_STATUS_BAD_PARAM.
"""

from __future__ import annotations

import numpy as np

from opgraph.backend import *
from opgraph.backend import (
    BackendError,
    create_descriptor,
    create_handle,
    execute,
    finalize,
    get_attribute,
    set_attribute,
)

N, C, H, W, K = 2, 8, 12, 12, 16
handle = create_handle()
device = handle.device
print(f"1. handle on {device}")


def tensor(uid: int, dims: list[int], strides: list[int], virtual: bool = False, dtype=CUDNN_DATA_FLOAT):
    t = create_descriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR)
    set_attribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, dtype)
    set_attribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims)
    set_attribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides)
    set_attribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
    set_attribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 16)
    set_attribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, virtual)
    finalize(t)
    return t


def nhwc(n: int, c: int, h: int, w: int) -> list[int]:
    return [h * w * c, 1, w * c, c]


x = tensor(101, [N, C, H, W], nhwc(N, C, H, W))
w = tensor(102, [K, C, 3, 3], nhwc(K, C, 3, 3))
b = tensor(103, [1, K, 1, 1], nhwc(1, K, 1, 1))
y = tensor(104, [N, K, H, W], nhwc(N, K, H, W))
conv_out = tensor(201, [N, K, H, W], nhwc(N, K, H, W), virtual=True)
bias_out = tensor(202, [N, K, H, W], nhwc(N, K, H, W), virtual=True)
print("2. tensors: X 101, W 102, B 103, Y 104 in NHWC; virtual conv output 201 and bias output 202")

conv = create_descriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
set_attribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 2)
set_attribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
set_attribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, CUDNN_CROSS_CORRELATION)
for attr, values in (
    (CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, [1, 1]),
    (CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, [1, 1]),
    (CUDNN_ATTR_CONVOLUTION_DILATIONS, [1, 1]),
    (CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, [1, 1]),
):
    set_attribute(conv, attr, CUDNN_TYPE_INT64, values)
finalize(conv)
print("3. convolution: 2 spatial dims, padding 1, stride 1, cross-correlation in FLOAT")

fprop = create_descriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, x)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, w)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv_out)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1.0)
set_attribute(fprop, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 0.0)
finalize(fprop)


def pointwise(mode, xdesc, ydesc, bdesc=None):
    pw = create_descriptor(CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
    set_attribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
    set_attribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
    finalize(pw)
    op = create_descriptor(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
    set_attribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, pw)
    set_attribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, xdesc)
    if bdesc is not None:
        set_attribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, bdesc)
    set_attribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, ydesc)
    finalize(op)
    return op


add = pointwise(CUDNN_POINTWISE_ADD, conv_out, bias_out, b)
relu = pointwise(CUDNN_POINTWISE_RELU_FWD, bias_out, y)
print("4. operations: conv fprop (alpha 1, beta 0) -> pointwise ADD with B -> pointwise RELU_FWD into Y")

op_graph = create_descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
set_attribute(op_graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle)
set_attribute(op_graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, [fprop, add, relu])
finalize(op_graph)
count = get_attribute(op_graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64)[0]
print(f"5. operation graph finalized (validated by opgraph): {count} engine(s) on {device}")

heur = create_descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)
set_attribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, op_graph)
set_attribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A)
finalize(heur)
engine_cfg = create_descriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)
get_attribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, into=[engine_cfg])
print(f"6. heuristics (mode A) ranked {len(heur.state)} config(s); the first: {engine_cfg.state.candidate.name}")

plan = create_descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
set_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle)
set_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, engine_cfg)
finalize(plan)
ws_size = get_attribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64)[0]
print(f"7. execution plan built: {len(plan.state.plan.steps)} step(s), workspace {ws_size} bytes")

rng = np.random.default_rng(0)
X = rng.standard_normal((N, H, W, C), dtype=np.float32).transpose(0, 3, 1, 2)  # NHWC memory, NCHW dims
Wt = rng.standard_normal((K, 3, 3, C), dtype=np.float32).transpose(0, 3, 1, 2)
B = rng.standard_normal((1, 1, 1, K), dtype=np.float32).transpose(0, 3, 1, 2)
Y = np.full((N, H, W, K), np.nan, np.float32).transpose(0, 3, 1, 2)
if device.is_cuda:
    import torch

    X, Wt, B, Y = (
        torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).cuda().permute(0, 3, 1, 2)
        for a in (X, Wt, B, Y)
    )
    pointers = [t.data_ptr() for t in (X, Wt, B, Y)]
    workspace = torch.empty(max(ws_size, 1), dtype=torch.uint8, device="cuda").data_ptr()
else:
    pointers = [X, Wt, B, Y]  # on the CPU the "pointers" are the arrays themselves
    workspace = None
pack = create_descriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, [101, 102, 103, 104])
set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers)
set_attribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, workspace)
finalize(pack)
status = execute(handle, plan, pack)
print(f"8. variant pack of UIDs 101..104 executed: {status.name}")

as_np = (lambda t: t.cpu().numpy()) if device.is_cuda else np.asarray
x64, w64, b64 = (as_np(a).astype(np.float64) for a in (X, Wt, B))
xp = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
want = np.zeros((N, K, H, W))
for r in range(3):
    for s in range(3):
        want += np.einsum("nchw,kc->nkhw", xp[:, :, r : r + H, s : s + W], w64[:, :, r, s])
want = np.maximum(want + b64, 0)
err = np.abs(as_np(Y).astype(np.float64) - want).max()
print(f"9. Y against a NumPy conv + bias + relu: max |error| {err:.2e}")
assert err < 1e-3

bad = create_descriptor(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
set_attribute(bad, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, x)
set_attribute(bad, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, b)
set_attribute(bad, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, y)
set_attribute(bad, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, conv)
finalize(bad)
g2 = create_descriptor(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
set_attribute(g2, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle)
set_attribute(g2, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, [bad])
try:
    finalize(g2)
except BackendError as refusal:
    print(
        f"10. the bias tensor given as the filter is refused ({refusal.status.name}, rule {refusal.rule}):\n"
        f"    {refusal}"
    )
