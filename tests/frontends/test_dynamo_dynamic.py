"""torch.compile(model, backend="opgraph") on graphs Dynamo made dynamic: each partition one dynamic plan
(opgraph.Dim dims) compiled once for every shape, against eager PyTorch (float64, the CPU reference
engine): forward and backward at several shapes, the ranges `mark_dynamic` gives, an open range widened
when a size outgrows it, a transformers Llama, and `dynamic_plans=False` (a compile per shape)."""

from __future__ import annotations

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn

from opgraph.frontends.dynamo_backend import reports  # noqa: E402
from opgraph.frontends.torch_symbolic import MIN_OPEN_UPPER, open_upper  # noqa: E402

from ..helpers import requires_interpreter  # noqa: E402
from .compile_models import gpt, mlp, tiny_llama  # noqa: E402

TOL = {"rtol": 1e-12, "atol": 1e-12}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _made(first: int) -> list:
    return reports()[first:]


def _check_training(model, compiled, x, tol=TOL):
    """Outputs and every parameter gradient (and the input's, where it has one) of one step, against eager."""
    twin_x = x.detach().clone().requires_grad_(x.requires_grad)
    out = compiled(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(twin_x)
    ref.square().mean().backward()
    torch.testing.assert_close(out, ref, **tol)
    if x.requires_grad:
        torch.testing.assert_close(x.grad, twin_x.grad, **tol)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, **tol)
    model.zero_grad()


def test_open_upper_doubles_past_the_size_met():
    assert open_upper(1) == open_upper(8) == MIN_OPEN_UPPER == 16
    assert open_upper(9) == 32 and open_upper(16) == 32 and open_upper(40) == 128
    assert all(open_upper(n) >= 2 * n for n in range(1, 5000))


def test_a_dynamic_training_graph_compiles_once_for_every_shape(caplog):
    torch.manual_seed(0)
    model = mlp().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    with caplog.at_level("INFO", logger="opgraph.dynamo"):
        for rows in (5, 3, 7, 2, 5):
            x = torch.randn(rows, 6, dtype=torch.float64, requires_grad=True)
            _check_training(model, compiled, x)
    made = _made(first)
    assert sorted(r.kind for r in made) == ["backward", "forward"], [str(r) for r in made]
    for r in made:
        assert r.partitions and not r.fallbacks, str(r)
        assert all(p.dims for p in r.partitions), str(r)  # dynamic plans
    forward = next(r for r in made if r.kind == "forward")
    assert any(isinstance(d, str) for shape in forward.shapes for d in shape)  # (symbolic sizes, by name)
    assert "its partitions are dynamic plans" in caplog.text
    assert "building it again" not in caplog.text  # (5 .. 7 rows: within the first range)


def test_mark_dynamic_bounds_the_plans_range():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8)).double()
    compiled = torch.compile(model, backend=og.torch_backend)
    first = len(reports())
    with torch.no_grad():
        for rows, seq in ((4, 9), (3, 30), (6, 64)):
            x = torch.randn(rows, seq, 6, dtype=torch.float64)
            torch._dynamo.mark_dynamic(x, 1, min=2, max=64)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    made = _made(first)
    # the first graph is dynamic in the sequence alone; the rows change at the second call, and Dynamo
    # compiles a graph dynamic in both (the rows' range open: 2..16 for now)
    assert [r.kind for r in made] == ["inference", "inference"], [str(r) for r in made]
    ranges = [sorted((lo, hi) for _, lo, hi in p.dims) for r in made for p in r.partitions]
    assert ranges == [[(2, 64)], [(2, 16), (2, 64)]], ranges


def test_a_size_past_an_open_range_builds_the_partition_again(caplog):
    torch.manual_seed(0)
    model = mlp().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    with caplog.at_level("INFO", logger="opgraph.dynamo"), torch.no_grad():
        for rows in (3, 4, 40, 5, 100, 33):  # 3 -> range up to 16; 40 -> 128; 100 within it
            x = torch.randn(rows, 6, dtype=torch.float64)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    made = _made(first)
    assert len(made) == 1 and made[0].kind == "inference", [str(r) for r in made]
    assert [hi for p in made[0].partitions for _, _, hi in p.dims] == [16]  # (the range compiled first)
    assert caplog.text.count("building it again") == len(made[0].partitions), caplog.text


def test_dynamic_plans_false_compiles_per_shape(caplog):
    torch.manual_seed(0)
    model = mlp().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True, options={"dynamic_plans": False})
    with caplog.at_level("INFO", logger="opgraph.dynamo"):
        for rows in (5, 3, 5):
            x = torch.randn(rows, 6, dtype=torch.float64, requires_grad=True)
            _check_training(model, compiled, x)
    assert caplog.text.count("compiling a dynamic graph for input shapes") == 2, caplog.text


def test_the_projects_gpt_trains_over_sequence_lengths():
    torch.manual_seed(0)
    model = gpt().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    for seq in (6, 3, 5):  # (8, its context, would be specialized: the model's mask[:t, :t] guards it)
        _check_training(model, compiled, torch.randint(0, 17, (2, seq)), {"rtol": 1e-9, "atol": 1e-10})
    made = _made(first)
    assert sorted(r.kind for r in made) == ["backward", "forward"], [str(r) for r in made]
    assert all(p.dims for r in made for p in r.partitions), [str(r) for r in made]


def test_a_transformers_llama_runs_at_every_length_in_one_dynamic_plan():
    model = tiny_llama()
    if model is None:
        pytest.skip("transformers is not installed")
    torch.manual_seed(0)
    model = model.double().eval()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (2, 3), (4, 6)):
            ids = torch.randint(0, 23, (batch, seq))
            # (Llama computes its RMSNorm and rotary tables in float32, the rest float64)
            torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-5, atol=1e-6)
    made = _made(first)
    assert [r.kind for r in made] == ["inference"], [str(r) for r in made]
    report = made[0]
    # the whole model in one dynamic plan, the attention mask's position bookkeeping included (transformers'
    # mask functions read position_ids[batch_idx, q_idx] through whole-axis slices of aranges)
    assert not report.fallbacks and len(report.partitions) == 1 and report.partitions[0].dims, str(report)


def test_a_slice_to_a_symbolic_end_joins_the_dynamic_plan():
    """transformers' packed-sequence check: diff(positions, prepend=first - 1) along the dynamic axis, its
    cumsum. torch.diff slices to an end torch passes as a SymInt (s - 1 of the prepended axis); it is the
    dims' expression in the plan, not a node left to PyTorch."""

    class PackedSequences(nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.diff(x, prepend=x[:, :1] - 1, dim=-1).cumsum(-1) * 2.0

    model = PackedSequences()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    for batch, seq in ((2, 5), (3, 7), (4, 9)):
        x = torch.randn(batch, seq, dtype=torch.float64)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    (report,) = _made(first)
    assert not report.fallbacks and len(report.partitions) == 1, str(report)
    assert report.partitions[0].dims, str(report)


@requires_interpreter
def test_generated_kernels_take_every_shape_of_the_range():
    """The GPU's engine (generated Triton kernels, under the interpreter here): one dynamic plan per
    graph, its kernels run at every shape (float32)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True, options={"engines": ["triton", "torch"]})
    first = len(reports())
    for batch, seq in ((4, 7), (3, 11), (2, 13)):
        x = torch.randn(batch, seq, 16, requires_grad=True)
        _check_training(model, compiled, x, {"rtol": 2e-5, "atol": 2e-5})
    made = _made(first)
    assert sorted(r.kind for r in made) == ["backward", "forward"], [str(r) for r in made]
    for r in made:
        assert not r.fallbacks and all(p.dims and dict(p.engines).get("triton") for p in r.partitions), str(r)


def test_a_view_whose_stride_holds_a_size_no_input_shows_is_copied_in(caplog):
    """The last token's rows of [B, S, D] (a view of stride S*D; `x[:, -1]`, a select from the end of a
    dynamic axis, is left to PyTorch) read by the next partition, whose input shows B and D, not S: it is
    declared packed (the view copied in), so the partition runs in opgraph at every shape instead of
    failing at its first call (the plan could not lay the view out without S) and falling back to PyTorch
    (BERT's pooler did so before its first-token select joined the plan)."""
    import logging

    class Pooler(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.b(torch.tanh(self.a(x)[:, -1]))

    torch.manual_seed(0)
    model = Pooler().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    with caplog.at_level(logging.WARNING, logger="opgraph.dynamo"), torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (4, 6)):
            x = torch.randn(batch, seq, 8, dtype=torch.float64)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    assert "failed to run" not in caplog.text, caplog.text
    made = _made(first)
    assert made and all(p.dims for r in made for p in r.partitions), [str(r) for r in made]


def test_ones_zeros_and_full_of_dynamic_sizes_join_the_plan():
    """OPT's default attention mask (`torch.ones(batch, seq)`) and its kin: a constant spread over dynamic
    dims, read off a tensor of the partition that has them, not a node left to PyTorch."""

    class Filled(nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            b, s, d = x.shape
            mask = torch.ones(b, s, dtype=x.dtype)
            return x * mask[..., None] + torch.zeros(b, 1, d, dtype=x.dtype) + torch.full((b, s, 1), 2.5, dtype=x.dtype)

    model = Filled()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    for batch, seq in ((2, 5), (3, 7), (4, 9)):
        x = torch.randn(batch, seq, 4, dtype=torch.float64)
        torch.testing.assert_close(compiled(x), model(x), **TOL)
    (report,) = _made(first)
    assert not report.fallbacks and len(report.partitions) == 1 and report.partitions[0].dims, str(report)


def test_a_select_from_the_start_of_a_dynamic_axis_joins_the_plan():
    """BERT's pooler: `hidden_states[:, 0]` over a dynamic sequence, in the plan (the slice op proves the
    position within the axis over its range), no node left to PyTorch."""

    class First(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.tanh(self.a(x)[:, 0])

    torch.manual_seed(0)
    model = First().double()
    compiled = torch.compile(model, backend=og.torch_backend, dynamic=True)
    first = len(reports())
    with torch.no_grad():
        for batch, seq in ((2, 5), (3, 7), (4, 6)):
            x = torch.randn(batch, seq, 8, dtype=torch.float64)
            torch.testing.assert_close(compiled(x), model(x), **TOL)
    (report,) = _made(first)
    assert not report.fallbacks and len(report.partitions) == 1, str(report)
