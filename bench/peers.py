"""The cuDNN frontend as a peer: fused graphs built with its Python API, when it is installed."""

from __future__ import annotations

from typing import Any, Callable

import torch

try:
    import cudnn  # nvidia-cudnn-frontend

    HANDLE = cudnn.create_handle()
except Exception:  # noqa: BLE001 - the peer is optional
    cudnn = None
    HANDLE = None


def available() -> bool:
    return cudnn is not None


def _graph():
    return cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=HANDLE)


def _finish(g, pack: dict, out_specs: list) -> tuple[list[torch.Tensor], Callable[[], Any]]:
    g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    ws = torch.empty(max(1, g.get_workspace_size()), device="cuda", dtype=torch.uint8)
    outs = []
    for t, dtype in out_specs:
        o = torch.empty_strided(tuple(t.get_dim()), tuple(t.get_stride()), dtype=dtype, device="cuda")
        pack[t] = o
        outs.append(o)
    g.execute(pack, ws, handle=HANDLE)
    torch.cuda.synchronize()
    return outs, (lambda: g.execute(pack, ws, handle=HANDLE))


def conv_bias_relu(x, w, b, pad: int, stride: int):
    g = _graph()
    X, W, B = g.tensor_like(x), g.tensor_like(w), g.tensor_like(b)
    c = g.conv_fprop(image=X, weight=W, padding=[pad, pad], stride=[stride, stride], dilation=[1, 1])
    y = g.relu(input=g.bias(input=c, bias=B))
    y.set_output(True).set_data_type(cudnn.data_type.HALF)
    (out,), run = _finish(g, {X: x, W: w, B: b}, [(y, torch.float16)])
    return out, run


def matmul_bias_gelu(a, bm, bias):
    g = _graph()
    A, Bm, Bias = g.tensor_like(a), g.tensor_like(bm), g.tensor_like(bias)
    y = g.gelu(input=g.add(a=g.matmul(A, Bm), b=Bias))
    y.set_output(True).set_data_type(cudnn.data_type.HALF)
    (out,), run = _finish(g, {A: a, Bm: bm, Bias: bias}, [(y, torch.float16)])
    return out, run


def sbr_conv_genstats(x, w, s, b):
    g = _graph()
    X, W, S, B = g.tensor_like(x), g.tensor_like(w), g.tensor_like(s), g.tensor_like(b)
    a = g.relu(input=g.bias(input=g.scale(input=X, scale=S), bias=B))
    y = g.conv_fprop(image=a, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    y.set_output(True).set_data_type(cudnn.data_type.HALF)
    s1, s2 = g.genstats(input=y)
    s1.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    s2.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    outs, run = _finish(g, {X: x, W: w, S: s, B: b},
                        [(y, torch.float16), (s1, torch.float32), (s2, torch.float32)])
    return outs, run
