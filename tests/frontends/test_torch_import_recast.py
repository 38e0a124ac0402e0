"""Exact widening casts read by several ops (torch_importer.Importer._recast): an RMSNorm's fp32 copy of a
bf16 residual stream, read by the mean of squares and by the scaling. In an inference import each reader
after the first casts the bf16 value again, so that no piece stores the fp32 copy for another to read; a
train-mode import keeps one cast (its gradient is summed in fp32, as PyTorch sums it)."""

from __future__ import annotations

import pytest

import opgraph as og

torch = pytest.importorskip("torch")
nn = torch.nn

from opgraph.frontends import from_torch  # noqa: E402


class Block(nn.Module):
    """A projection, the residual add and the next RMSNorm, written as Hugging Face's Llama writes it."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d, bias=False)
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) + residual
        wide = h.to(torch.float32)
        variance = wide.pow(2).mean(-1, keepdim=True)
        normed = wide * torch.rsqrt(variance + 1e-6)
        return self.weight * normed.to(h.dtype)


@pytest.fixture(autouse=True)
def written_out_norms(monkeypatch):
    """The Block's RMSNorm as written: import recognises Hugging Face's pattern as one rmsnorm op
    (frontends/fx_norms.py), which reads the bf16 stream itself; the recast serves any other widening cast read
    by several ops (a norm written otherwise, an fp32 statistic), here this one."""
    import opgraph.frontends.torch_import as torch_import

    monkeypatch.setattr(torch_import, "recognise_rms_norms", lambda *a, **k: 0)


def _casts(imported) -> list[str]:
    return [n.name for n in imported.graph.final.nodes if n.kind == "pointwise" and "cast" in n.name]


def test_an_inference_import_casts_again_for_each_reader():
    torch.manual_seed(0)
    model = Block().to(torch.bfloat16).eval()
    x, res = torch.randn(2, 8, 32, dtype=torch.bfloat16), torch.randn(2, 8, 32, dtype=torch.bfloat16)
    imported = from_torch(model, (x, res))
    names = _casts(imported)
    assert sum("recast" in n for n in names) == 1, names
    want = model(x, res).float()
    got = imported.run(x, res).float()
    assert ((got - want).norm() / want.norm()).item() < 1e-2


def test_a_train_mode_import_keeps_one_cast():
    model = Block().to(torch.bfloat16).train()
    x, res = torch.randn(2, 8, 32, dtype=torch.bfloat16), torch.randn(2, 8, 32, dtype=torch.bfloat16)
    assert not any("recast" in n for n in _casts(from_torch(model, (x, res))))


def test_the_plan_stores_no_wide_copy_between_pieces():
    """On a (simulated) H200 the projection's piece stores the bf16 sum and the mean of squares, and the
    norm's piece reads the bf16 sum: no fp32 tensor of the stream's size crosses between pieces."""
    from opgraph.build.partition import partition
    from opgraph.build.planner import usable_engines
    from opgraph.core.config import Support
    from opgraph.core.device import Device
    from opgraph.engines import get_engine

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    model = Block(256).to(torch.bfloat16).eval()
    x, res = torch.randn(4, 64, 256, dtype=torch.bfloat16), torch.randn(4, 64, 256, dtype=torch.bfloat16)
    graph = from_torch(model, (x, res)).graph.final
    engine = type(get_engine("triton"))
    saved = engine.available
    engine.available = lambda self, device: Support.yes()
    try:
        pieces, _ = partition(graph, usable_engines(["triton"], h200), h200)
    finally:
        engine.available = saved
    crossing = {u for p in pieces for u in p.outputs} & {u for p in pieces for u in p.inputs}
    wide = [graph.tensors[u] for u in crossing if graph.tensors[u].data_type is og.DataType.FLOAT]
    assert all(t.numel < 4 * 64 * 256 for t in wide), [t.name for t in wide]


def test_a_widening_entry_reads_only_its_own_cast(monkeypatch):
    """A widening cast's entry holds the cast and is dropped with a rolled-back translation: an id alone could
    name a tensor made later at a freed cast's address (the Hugging Face Llama's rotary cast of its bf16
    inv_freq, folded away and rolled back, once made the RMSNorm after the embedding read inv_freq's 32
    values: a rank error in a fresh process, silently wrong values where the shapes had agreed)."""
    from opgraph.frontends import torch_importer

    made = []
    init = torch_importer.Importer.__init__
    monkeypatch.setattr(
        torch_importer.Importer, "__init__", lambda self, *a, **k: made.append(self) or init(self, *a, **k)
    )
    model = Block().to(torch.bfloat16).eval()
    x, res = torch.randn(2, 8, 32, dtype=torch.bfloat16), torch.randn(2, 8, 32, dtype=torch.bfloat16)
    from_torch(model, (x, res))
    imp = made[0]
    (narrow, node, cast), *_ = imp.widened.values()
    other = imp.g.tensor(dim=[2, 8, 32], name="other")
    imp.widened[id(other)] = (narrow, node, cast)  # (what a freed cast's entry says of a tensor at its address)
    assert imp.tensor(torch_importer.Value((2, 8, 32), torch.float32, tensor=other)) is other
    mark = imp.checkpoint()
    rolled = imp.g.identity(other, name="rolled_back")
    imp.widened[id(rolled)] = (narrow, node, rolled)
    imp.rollback(mark)
    assert id(rolled) not in imp.widened
