"""AOTAutograd's attention kernels and their backward ops (opgraph/frontends/aot_attention.py), each
traced with fake tensors (so the CUDA kernels' graphs are made on the CPU too), imported and run by
the reference engine against attention computed in float64 from its definition."""

from __future__ import annotations

import math
import operator

import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph.frontends.fx_graph import import_fx  # noqa: E402

aten = torch.ops.aten
B, HQ, HKV, SQ, SKV, E = 2, 4, 2, 5, 7, 8


def _inputs(seed=0, sq=SQ, hkv=HKV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, sq, E, generator=g, dtype=torch.float64)
    k = torch.randn(B, hkv, SKV, E, generator=g, dtype=torch.float64)
    v = torch.randn(B, hkv, SKV, E, generator=g, dtype=torch.float64)
    return q, k, v


def _attention(q, k, v, causal, bias=None):
    """[out, lse [B, H, Sq]] of the scaled scores, GQA by repeating k/v heads; causal top-left."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def _run(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    imported = import_fx(gm)
    assert not imported.report.custom_ops, imported.report.summary()
    return imported.run(*args)


FORWARDS = {
    "flash": lambda q, k, v, c: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, c)[:2],
    "flash_for_cpu": lambda q, k, v, c: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, c),
    "cudnn": lambda q, k, v, c: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, c)[:2],
    "efficient": lambda q, k, v, c: aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, c)[:2],
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", list(FORWARDS))
def test_forward_output_and_log_sum_exp(kernel, causal):
    sq = 32 if kernel == "efficient" else SQ  # (its log-sum-exp rows are padded to a multiple of 32)
    q, k, v = _inputs(sq=sq)
    out, lse = _run(lambda q, k, v: FORWARDS[kernel](q, k, v, causal), q, k, v)
    want, want_lse = _attention(q, k, v, causal)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert lse.dtype == (torch.float64 if kernel == "flash_for_cpu" else torch.float32)  # as PyTorch's kernels
    torch.testing.assert_close(lse.reshape(want_lse.shape).double(), want_lse, rtol=1e-6, atol=1e-6)


def test_inference_forward_with_a_float_mask_as_bias():
    q, k, v = _inputs(1)
    bias = torch.randn(1, 1, SQ, SKV, dtype=torch.float64)

    def fn(q, k, v, bias):
        return aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, 0.0, False)[0]

    (out,) = _run(fn, q, k, v, bias)
    torch.testing.assert_close(out, _attention(q, k, v, False, bias)[0], rtol=1e-12, atol=1e-12)


def _grads(q, k, v, causal, do):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = _attention(q, k, v, causal)
    return out.detach(), lse.detach(), torch.autograd.grad(out, (q, k, v), do)


def _seed():
    return torch.zeros((), dtype=torch.int64)


BACKWARDS = {
    "flash": lambda do, q, k, v, o, lse, c: aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, None, None, SQ, SKV, 0.0, c, _seed(), _seed()
    ),
    "flash_for_cpu": lambda do, q, k, v, o, lse, c: aten._scaled_dot_product_flash_attention_for_cpu_backward(
        do, q, k, v, o, lse, 0.0, c
    ),
    "cudnn": lambda do, q, k, v, o, lse, c: aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, o, lse.unsqueeze(-1), _seed(), _seed(), None, None, None, SQ, SKV, 0.0, c
    ),
    "efficient": lambda do, q, k, v, o, lse, c: aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, None, o, torch.nn.functional.pad(lse, (0, 32 - SQ)), _seed(), _seed(), 0.0,
        [True, True, True, False], c
    )[:3],
}  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", list(BACKWARDS))
def test_backward_gradients(kernel, causal):
    q, k, v = _inputs(2, hkv=HQ)  # (PyTorch repeats k/v heads before these kernels)
    do = torch.randn(B, HQ, SQ, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    o, lse, want = _grads(q, k, v, causal, do)
    got = _run(lambda do, q, k, v, o, lse: BACKWARDS[kernel](do, q, k, v, o, lse, causal), do, q, k, v, o, lse)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=name)


def test_dropout_and_rng_state_stay_in_pytorch():
    """Dropout (PyTorch's RNG stream) is left opaque; a forward whose RNG state is read (saved for
    PyTorch's backward) is refused, naming why: the backend's partitioner leaves both to PyTorch."""
    q, k, v = _inputs()

    def dropout(q, k, v):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.1, False)

    assert import_fx(make_fx(dropout, tracing_mode="fake")(q, k, v)).report.custom_ops

    def rng_state(q, k, v):
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False)[6]

    with pytest.raises(og.UnsupportedGraphError, match="RNG state"):
        import_fx(make_fx(rng_state, tracing_mode="fake")(q, k, v))


def test_saved_state_without_dropout_is_freed_so_the_forward_translates():
    """A training forward saves its attention's RNG state (and sequence bounds) for the backward;
    without dropout nothing reads their values, so the backend's graph gets placeholders for them and
    the attention runs in the forward's plan: its output and log-sum-exp as the definition's, the
    placeholders of the traced shapes and types, no fallback. With dropout the state stays read."""
    from opgraph.frontends.aot_attention import free_attention_state
    from opgraph.frontends.dynamo_partition import compile_graph

    q, k, v = _inputs(4, hkv=HQ)

    def saved(p):
        def forward(q, k, v):
            r = aten._scaled_dot_product_flash_attention(q, k, v, p, True, scale=0.3)
            return r[0], r[1], r[6], r[7], r[5] + 0 * r[0].sum()

        return forward

    gm = make_fx(saved(0.0), tracing_mode="fake")(q, k, v)

    def state(gm):
        return [n for n in gm.graph.nodes if n.target is operator.getitem and n.args[1] >= 2 and n.users]

    saved_state = [n.meta["val"] for n in state(gm) if n.args[1] in (6, 7)]
    assert len(saved_state) == 2
    bound_node = next(n for n in gm.graph.nodes if n.target is operator.getitem and n.args[1] == 5)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_node.args = ((*out_node.args[0], bound_node),)  # (an int result read, as a graph saving it would)
    assert free_attention_state(gm) == 3  # the seed, the offset and the int bound max_k
    assert out_node.args[0][-1] == SKV
    assert not state(gm)
    fused, report = compile_graph(
        make_fx(saved(0.0), tracing_mode="fake")(q, k, v), "forward", 0, engines=None, build_options={}
    )
    assert not report.fallbacks or all("attention" not in f.target for f in report.fallbacks), report
    out, lse, seed, offset, bound = fused(q, k, v)
    s = (q @ k.transpose(-1, -2)) * 0.3
    s = s.masked_fill(~torch.ones(SQ, SKV, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v, rtol=1e-10, atol=1e-10)
    assert lse.dtype == torch.float32  # (PyTorch's kernels keep it in float32)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=1e-6, atol=1e-6)
    for got, want in zip((seed, offset), saved_state):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    torch.testing.assert_close(bound, torch.full_like(bound, SKV))

    dropped = make_fx(saved(0.1), tracing_mode="fake")(q, k, v)
    assert free_attention_state(dropped) == 0


def test_safe_softmax_gives_zero_rows_where_every_score_is_masked():
    """aten._safe_softmax (PyTorch's math attention on CUDA, in inference graphs): softmax, and 0 for
    a row wholly -inf (where softmax gives NaN)."""
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    s[0, 1, 2] = -math.inf  # a fully masked row
    s[1, 0, :, :3] = -math.inf  # partly masked rows
    (got,) = _run(lambda s: aten._safe_softmax(s, -1), s)
    want = torch.softmax(s, -1).nan_to_num(0.0)
    assert float(want[0, 1, 2].abs().sum()) == 0.0
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got, aten._safe_softmax(s, -1), rtol=1e-12, atol=1e-12)
