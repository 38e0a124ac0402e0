"""ImportedGraph.run between calls: one variant pack per plan and device, reused (inputs copied in, the
module's tensors kept bound, no re-binding of the plan), results copied out unless asked not to, and
every change to the module seen (replaced or moved tensors re-bound, in-place updates read through,
folded batchnorm coefficients recomputed)."""

from __future__ import annotations

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).double().eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    return model


def _x(seed: int, rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_repeated_calls_reuse_the_pack_and_the_binding():
    model = _model()
    imported = og.from_torch(model, (_x(0),))
    with torch.no_grad():
        first = imported.run(_x(1), engines=["torch"])
        plan = imported.plan("cpu", ["torch"])
        (state,) = imported._runs.values()
        version = plan.local_state().binder.version
        outs = [imported.run(_x(i), engines=["torch"]) for i in range(2, 5)]
        assert imported._runs[next(iter(imported._runs))] is state
        assert plan.local_state().binder.version == version, "the plan was bound again"
        for i, out in zip(range(2, 5), outs):  # copies: not overwritten by the calls after
            torch.testing.assert_close(out, model(_x(i)), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(first, model(_x(1)), rtol=1e-12, atol=1e-12)


def test_reuse_outputs_returns_the_packs_buffers():
    model = _model()
    imported = og.from_torch(model, (_x(0),))
    a = imported.run(_x(1), reuse_outputs=True)
    ptr = a.data_ptr()
    b = imported.run(_x(2), reuse_outputs=True)
    assert b.data_ptr() == ptr and torch.equal(a, b)  # the same buffer, overwritten
    with torch.no_grad():
        torch.testing.assert_close(b, model(_x(2)), rtol=1e-12, atol=1e-12)


def test_changes_to_the_module_are_seen():
    model = _model()
    imported = og.from_torch(model, (_x(0),))
    x = _x(1)
    imported.run(x)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place: read through the bound view
        torch.testing.assert_close(imported.run(x), model(x), rtol=1e-12, atol=1e-12)
        model[3].weight = nn.Parameter(torch.randn(3, 8, dtype=torch.float64))  # replaced: bound again
        torch.testing.assert_close(imported.run(x), model(x), rtol=1e-12, atol=1e-12)
        model[1].weight.add_(0.5)  # folded batchnorm coefficients: recomputed
        model[1].running_var.mul_(3.0)
        torch.testing.assert_close(imported.run(x), model(x), rtol=1e-12, atol=1e-12)


def test_train_mode_running_stats_and_bad_inputs():
    model = _model().train()
    ref = _model().train()
    imported = og.from_torch(model, (_x(0),))
    for i in range(3):
        torch.testing.assert_close(imported.run(_x(i)), ref(_x(i)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean, rtol=1e-12, atol=1e-12)
    assert int(model[1].num_batches_tracked) == 3
    with pytest.raises(og.VariantPackError, match="import.input_shape"):
        imported.run(_x(0, rows=4))
    with pytest.raises(og.VariantPackError, match="import.input_dtype"):
        imported.run(_x(0).float())
    torch.testing.assert_close(imported.run(_x(9)), ref(_x(9)), rtol=1e-12, atol=1e-12)  # still usable


class _WithConstants(nn.Module):
    """A constant made in forward (folded at import), a value derived from it alone, and a random draw."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.arange(4, dtype=torch.float64)
        return self.lin(x) * (c * 2 + 1) + torch.rand_like(x) * 0


def test_preload_makes_the_device_copies_of_constants_now_and_leaves_random_draws():
    """PlanModule.reserve preloads its bound inputs before PyTorch's CUDA graph trees record the first
    calls: a constant's device copy made during a recording stays in their private pool, not an
    output, and they refuse the graph (issue 43). On the CPU, a `meta` device stands in for CUDA."""
    imported = og.from_torch(_WithConstants(), (torch.randn(3, 4, dtype=torch.float64),))
    sources = [s for _, s in imported.bound_inputs]
    kinds = {s.kind for s in sources}
    assert kinds & {"constant", "derived"}, kinds  # (the model gives the importer something to fold)
    meta = torch.device("meta")
    imported.preload(sources, meta)
    made = dict(imported._device_constants)
    derived = dict(imported._derived_cache)
    assert made or derived
    imported.preload(sources, meta)  # once: a second preload makes nothing new
    assert all(imported._device_constants[k] is v for k, v in made.items())
    assert all(imported._derived_cache[k][2] is v[2] for k, v in derived.items())
    for s in sources:
        if not imported._fixed(s):
            assert s.kind in ("random", "derived", "parameter", "buffer")


def test_a_new_shape_takes_the_module_side_of_a_pack_of_another_shape():
    """A dynamic import's pack at a new shape shares the bound module tensors of the plan's pack at another
    shape (resolved once); its inputs and outputs are its own, and an in-place update of a parameter is
    seen at every shape."""
    from torch.export import Dim

    model = _model()
    model[1] = nn.Identity()  # (batchnorm's folded coefficients are derived inputs: covered above)
    imported = og.from_torch(model, (_x(0, rows=5),), dynamic_shapes=({0: Dim("rows", min=2, max=32)},))
    resolved = []
    original = imported._resolve
    imported._resolve = lambda *a, **k: resolved.append(a[0]) or original(*a, **k)
    with torch.no_grad():
        for rows in (5, 9, 17):
            torch.testing.assert_close(imported.run(_x(rows, rows)), model(_x(rows, rows)), rtol=1e-12, atol=1e-12)
        first, *others = imported._runs.values()
        bound = [h.known_uid() for h, _ in imported._bound]
        assert bound and all(p.pack[u] is first.pack[u] for p in others for u in bound)
        assert len({id(p.pack[imported.graph.final.outputs[0]]) for p in (first, *others)}) == 3
        assert len(resolved) == len(bound)  # (the first shape's pack resolved them, the others took them)
        model[0].weight.mul_(2.0)  # in place: read through at a new shape and at a shape met before
        for rows in (11, 9):
            torch.testing.assert_close(imported.run(_x(rows, rows)), model(_x(rows, rows)), rtol=1e-12, atol=1e-12)
