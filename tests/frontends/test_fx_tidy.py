"""AOTAutograd graphs tidied before partitioning (opgraph/frontends/fx_tidy.py): each rewrite on the graphs
it is for, what it leaves alone (results the caller sees, ops with effects), that the tidied graph computes
what the traced one does, and the torch.compile backend's Llama forward with no cast left standing alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from opgraph.frontends import fx_tidy  # noqa: E402

aten = torch.ops.aten
BF16 = torch.bfloat16


def traced(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def calls(gm, name):
    return [n for n in gm.graph.nodes if n.op == "call_function" and fx_tidy._name(n) == name]


def check_same(gm, fn, *args):
    got, want = gm(*args), fn(*args)
    for g, w in zip(got if isinstance(got, (tuple, list)) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def three_casts(x, w):
    """A normed activation cast once per product reading it (autocast: q, k and v), each cast also
    returned (saved for the backward); the first result is the caller's."""
    y = x * 2.0
    a, b, c = y.to(BF16), y.to(BF16), y.to(BF16)
    return (a @ w.to(BF16)).sum(), a, b, c


def test_identical_casts_become_one_and_the_saved_results_share_it():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = traced(three_casts, x, w)
    assert len([n for n in calls(gm, "_to_copy") if n.args[0].op != "placeholder"]) == 3
    assert fx_tidy.merge_duplicates(gm, user_outputs=range(1)) == 2
    gm.recompile()
    assert len([n for n in calls(gm, "_to_copy") if n.args[0].op != "placeholder"]) == 1
    check_same(gm, three_casts, x, w)


def test_results_the_caller_sees_are_never_merged():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = traced(three_casts, x, w)
    assert fx_tidy.merge_duplicates(gm, user_outputs=None) == 0  # (every result the caller's)
    gm = traced(lambda x: (x.to(BF16), x.to(BF16) * 2), x)
    assert fx_tidy.merge_duplicates(gm, user_outputs=range(1)) == 1  # (the product reads the first)
    assert len(calls(gm, "_to_copy")) == 1


def test_random_draws_are_not_merged():
    gm = traced(lambda x: (torch.rand_like(x), torch.rand_like(x)), torch.randn(4))
    assert fx_tidy.merge_duplicates(gm, user_outputs=range(0)) == 0


def test_a_transposed_gradient_transposed_back_is_the_product():
    a, b = torch.randn(6, 4, dtype=BF16), torch.randn(6, 3, dtype=BF16)

    def wgrad(a, b):  # (AOTAutograd's weight gradient: t(t(mm)) then the weight's dtype)
        return (a.t() @ b).t().t().to(torch.float32)

    gm = traced(wgrad, a, b)
    assert fx_tidy.cancel_transposes(gm) == 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    cast = calls(gm, "_to_copy")[0]
    assert fx_tidy._name(cast.args[0]) == "mm", gm.graph  # (the cast reads the product: its epilogue)
    check_same(gm, wgrad, a, b)


@pytest.mark.parametrize(
    "first, second, cancels",
    [((0, 2, 1), (0, 2, 1), True), ((1, 2, 0), (2, 0, 1), True), ((1, 2, 0), (1, 2, 0), False)],
)
def test_permutes_cancel_only_when_they_compose_to_none(first, second, cancels):
    x = torch.randn(2, 3, 4)
    fn = lambda x: x.permute(*first).permute(*second) + 1  # noqa: E731
    gm = traced(fn, x)
    assert fx_tidy.cancel_transposes(gm) == int(cancels)
    gm.recompile()
    check_same(gm, fn, x)


def test_an_activation_cast_moves_beside_its_source_past_a_weight_cast():
    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def layer(x, w):  # (autocast's order: the weight's cast between the activation and its cast)
        y = x.exp().rsqrt()
        wb = w.to(BF16)
        return y.to(BF16) @ wb.t(), wb

    gm = traced(layer, x, w)
    assert fx_tidy.casts_after_sources(gm) >= 1
    gm.recompile()
    order = [n for n in gm.graph.nodes if n.op == "call_function"]
    rsqrt = calls(gm, "rsqrt")[0]
    assert order[order.index(rsqrt) + 1].args[0] is rsqrt  # the activation's cast right after it
    weight_cast = next(n for n in calls(gm, "_to_copy") if n.args[0].op == "placeholder")
    assert order.index(weight_cast) == 0  # (a returned weight's cast at the start)
    check_same(gm, layer, x, w)


def test_a_returned_view_read_inside_is_made_again_for_the_result():
    x, w = torch.randn(2, 4, 8), torch.randn(8, 8)

    def forward(x, w):  # q transposed for attention and saved for the backward
        q = (x @ w).view(2, 4, 2, 4).transpose(1, 2)
        return (q * 2).sum(), q

    gm = traced(forward, x, w)
    assert fx_tidy.views_outside(gm) == 1
    gm.graph.eliminate_dead_code()
    gm.recompile()
    output = fx_tidy._output(gm)
    saved = output.args[0][1]
    assert list(saved.users) == [output] and fx_tidy._name(saved) == "transpose"
    chain = fx_tidy._view_chain(saved)
    assert all(len(v.users) == 1 for v in chain)  # (views of the result alone: PyTorch makes them)
    assert fx_tidy._name(chain[-1].args[0]) in ("mm", "bmm", "matmul", "_unsafe_view", "view"), gm.graph
    check_same(gm, forward, x, w)


def test_a_returned_view_read_by_nothing_else_is_left():
    gm = traced(lambda x: (x.exp(), x.exp().t()), torch.randn(3, 4))
    assert fx_tidy.views_outside(gm) == 0


def test_a_concatenation_to_an_empty_cache_is_its_input():
    empty = torch.zeros(2, 2, 0, 4)

    def cached(k, cache):
        return torch.cat([cache, k * 2], dim=-2).sum(), torch.cat([cache, k], -2)

    k = torch.randn(2, 2, 3, 4)
    gm = traced(cached, k, empty)
    assert fx_tidy.drop_empty_concats(gm, user_outputs=range(2)) == 2  # (the result's cat keeps a copy)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    cats = calls(gm, "cat")
    assert len(cats) == 1 and len(cats[0].args[0]) == 1
    check_same(gm, cached, k, empty)


def test_the_backend_llama_forward_casts_each_activation_once_beside_its_source():
    """Through torch.compile(backend=opgraph) under autocast: a Llama layer's forward graph, as the
    partitioner sees it, casts the normed activations once, right after the op making them."""
    transformers = pytest.importorskip("transformers")
    import opgraph as og
    from opgraph.frontends import dynamo_partition

    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).train()
    seen = []  # per graph: (the sources of its casts, casts not beside their source) as tidied
    tidy = dynamo_partition.tidy

    def spy(gm, *args, **kwargs):
        done = tidy(gm, *args, **kwargs)
        casts = [n for n in gm.graph.nodes if fx_tidy._cast_source(n) is not None]
        apart = [
            n.name
            for n in casts
            if n.args[0].op == "call_function" and n.prev is not n.args[0] and fx_tidy._cast_source(n.prev) is None
        ]
        seen.append(([n.args[0].name for n in casts], apart))
        return done

    x = torch.randint(0, 64, (2, 8))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dynamo_partition, "tidy", spy)
        net = torch.compile(model, backend=og.torch_backend, dynamic=False, options={"engines": ["reference"]})
        with torch.autocast("cpu", dtype=BF16):
            out = net(x).logits
        out.float().sum().backward()
    sources, apart = seen[0]  # (the forward)
    assert len(sources) > 8 and len(sources) == len(set(sources)), sources  # each activation cast once
    assert not apart, apart
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(config).train()
    with torch.autocast("cpu", dtype=BF16):
        want = eager(x).logits
    want.float().sum().backward()
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-2, msg=name)


# -- what a review found (each failed before its fix) ------------------------------------------------------


def compiled(fn):
    import opgraph as og

    torch._dynamo.reset()
    return torch.compile(fn, backend=og.torch_backend, options={"engines": ["reference"]})


def test_scalars_of_other_types_are_not_merged():
    """1, 1.0 and True compare (and hash) equal: an int sum and a float sum of one tensor stay two ops."""
    ids = torch.arange(6)
    gm = traced(lambda ids: (ids + 1.0, ids + 1, ids * -0.0, ids * 0.0), ids)
    assert fx_tidy.merge_duplicates(gm, user_outputs=range(0)) == 0

    def f(x, ids):
        a = (ids + 1.0) * 0.5
        b = ids + 1
        return x[:6] * a + torch.gather(x, 0, b)

    x, ids = torch.randn(8), torch.arange(6).flip(0)
    torch.testing.assert_close(compiled(f)(x, ids), f(x, ids))


def test_a_saved_tensor_is_not_made_a_view_of_the_callers_result():
    """Two casts of one input, the first returned to the caller, the second saved (transposed) for the
    backward: merged, the saved tensor would be a view of the caller's result, whose in-place change
    before the backward would break it."""

    def f(x, w):
        a = x.to(BF16)
        b = x.to(BF16)
        return a, w.to(BF16) @ b.t()

    grads = []
    for fn in (f, compiled(f)):
        torch.manual_seed(0)
        x, w = torch.randn(4, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True)
        a, y = fn(x, w)
        with torch.no_grad():
            a.mul_(0)
        y.float().sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[1], grads[0])


def test_a_concatenation_keeps_its_layout_and_its_type_promotion():
    """An empty cache concatenated with a transposed tensor: the result is contiguous, as the views after
    it were traced; an empty fp32 input promotes bf16 inputs to fp32."""

    class Cached(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(2, 2, 0, 4))

        def forward(self, x):
            k = (x * 2).view(2, 3, 2, 4).transpose(1, 2)
            k = torch.cat([self.cache, k], -2)
            return k.view(2, -1).sort().values

    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(compiled(Cached())(x), Cached()(x))
    empty, a = torch.zeros(0, 4), torch.randn(3, 4, dtype=BF16)
    gm = traced(lambda e, a, b: torch.cat([e, a, b]), empty, a, a)
    fx_tidy.drop_empty_concats(gm, user_outputs=None)
    gm.recompile()
    assert gm(empty, a, a).dtype == torch.float32


def test_a_graph_with_effect_tokens_protects_every_result():
    """A forward with an effectful op returns its effect tokens first, which AOTAutograd's count of the
    caller's results leaves out: every result is then the caller's, and the one concatenated to an empty
    buffer stays a tensor of its own (not the caller's input)."""

    class Printing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(0, 4))

        def forward(self, x):
            torch.ops.aten._print("opgraph test")
            return (x * 2).sum(), torch.cat([self.cache, x], 0)

    x = torch.randn(3, 4, requires_grad=True)
    _, c = compiled(Printing())(x)
    assert c.data_ptr() != x.data_ptr()
    with torch.no_grad():
        c.mul_(0)
    assert x.abs().sum() > 0


def test_a_view_as_another_dtype_is_left_to_pytorch():
    """`x.view(torch.int32)` reinterprets the bytes: the importer declines it (it ran as a reshape, giving
    the float values as they were), and the tidy does not make it again as a view of the dims."""

    def f(x):
        v = (x * 2).view(torch.int32)
        return v + 1, v

    x = torch.randn(4, 4)
    for got, want in zip(compiled(f)(x), f(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    gm = traced(f, x)
    fx_tidy.views_outside(gm)  # (the alias after the reinterpretation, made again of it: no reshape)
    gm.recompile()
    for got, want in zip(gm(x), f(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_a_concatenation_promoting_its_inputs_types_is_left_to_pytorch():
    """An empty fp32 cache concatenated with bf16 values is fp32 (torch.cat promotes across every input,
    empty ones too): the importer, which drops empty inputs, declines it rather than give bf16."""

    class Promoting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(2, 0, 8))

        def forward(self, x):
            k = torch.cat([self.cache, torch.sort(x, -1)[0]], dim=1)
            return torch.sort(k, -1)[0] * 1.001 + 1000

    x = torch.randn(2, 3, 8).bfloat16()
    got, want = compiled(Promoting())(x), Promoting()(x)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)
