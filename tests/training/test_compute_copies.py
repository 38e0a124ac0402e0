"""Compute copies (opgraph.training.step_graph, TrainStep): with mixed precision, each parameter's 16-bit
cast is step state written by its update, not a cast pass of every forward. Checked against the same step
without them (losses and parameters bit for bit), after parameters change outside the step, through a
checkpoint, with fp16's skipped updates, and under the interpreter (the copy written in the update's kernel)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import opgraph as og
from opgraph.training import SGD, AdamW, train_step

from ..helpers import requires_cuda, requires_interpreter

torch = pytest.importorskip("torch")


def _gpt(dtype=torch.float32, **kw):
    from ..frontends.gpt_models import GPT

    torch.manual_seed(0)
    return GPT(**kw).to(dtype).train()


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 17, (2, 8), generator=g), torch.randint(0, 17, (2, 8), generator=g)


def _step(model, x, copies, mixed="bf16", optimizer=None, **options):
    opt = optimizer if optimizer is not None else AdamW(1e-2, weight_decay=0.1)
    return train_step(
        og.from_torch(model, (x,)), "cross_entropy", opt, mixed_precision=mixed, compute_copies=copies, **options
    )


def _casts_of_params(step):
    final = step.graph.final
    params = {s.uid for s in step.params}
    return [
        n.name
        for n in final.nodes
        if n.kind == "pointwise" and n.op.mode.name == "IDENTITY" and set(n.input_uids()) & params
    ]


def test_the_step_reads_copies_and_trains_bit_for_bit_as_with_casts():
    """Every GEMM weight gets a copy (bf16, laid out like the parameter's view) and no cast of a
    parameter is left; norm weights and the embedding, read in fp32, get none. Three AdamW steps give the
    losses and parameters of the step that casts every forward, bit for bit, and each copy holds its
    parameter cast to bf16 after them."""
    x, y = _batch()
    base = _gpt()
    with_copies, without = copy.deepcopy(base), copy.deepcopy(base)
    a, b = _step(with_copies, x, True), _step(without, x, False)
    slots = {s.key: s for s in a.params}
    copied = {k for k, s in slots.items() if s.compute_copy is not None}
    final = a.graph.final
    linear = {k for k in slots if k.endswith((".qkv.weight", ".proj.weight", ".fc.weight"))}
    assert copied == linear, copied  # (wte is tied: read as W and W^T, its casts stay)
    assert all(any(n.kind == "matmul" for n in final.nodes if slots[k].compute_copy in n.input_uids()) for k in copied)
    assert all(final.tensors[slots[k].compute_copy].data_type is og.DataType.BFLOAT16 for k in copied)
    assert not _casts_of_params(a), _casts_of_params(a)
    assert _casts_of_params(b) and all(s.compute_copy is None for s in b.params)
    for _ in range(3):
        assert float(a.run(x, y)) == float(b.run(x, y))
    for (name, p), q in zip(with_copies.named_parameters(), without.parameters()):
        assert torch.equal(p, q), name
    pack = a._pack
    for k in copied:
        want = with_copies.get_parameter(k).detach().to(torch.bfloat16)
        got = pack[slots[k].compute_copy]
        assert torch.equal(slots[k].source.apply(want) if slots[k].source else want, got), k


def test_a_parameter_changed_by_torch_is_cast_again_before_the_next_step():
    """An in-place torch op on a parameter between steps (its version counter moves) refreshes that copy
    before the next step: the loss is the one of a fresh step on the changed module. A write through
    `.data` (which PyTorch does not count) takes `refresh_compute_copies()`."""
    x, y = _batch()
    model = _gpt()
    step = _step(model, x, True, optimizer=SGD(0.0))  # (lr 0: the step changes nothing itself)
    step.run(x, y)
    weight = next(s.key for s in step.params if s.compute_copy is not None)
    with torch.no_grad():
        model.get_parameter(weight).mul_(-3.0)
    fresh = _step(copy.deepcopy(model), x, False, optimizer=SGD(0.0))
    want = float(fresh.run(x, y))
    assert float(step.run(x, y)) == want
    model.get_parameter(weight).data.mul_(0.25)
    fresh = _step(copy.deepcopy(model), x, False, optimizer=SGD(0.0))
    want = float(fresh.run(x, y))
    assert step.refresh_compute_copies(force=False) == 0  # (PyTorch did not count that write)
    assert step.refresh_compute_copies() == sum(s.compute_copy is not None for s in step.params)
    assert float(step.run(x, y)) == want


def test_a_loaded_checkpoint_is_what_the_next_step_reads():
    """A step loaded with another step's checkpoint continues as that step does (its copies cast from the
    loaded parameters, not left at the module's old values)."""
    x, y = _batch()
    first = _gpt()
    a = _step(first, x, True)
    for _ in range(2):
        a.run(x, y)
    second = _gpt()
    b = _step(second, x, True)
    b.run(x, y)  # (copies made from the first values)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert float(b.run(x, y)) == float(a.run(x, y))


def test_fp16_skipped_update_leaves_the_copy_as_the_parameter():
    """fp16 with a loss scale that overflows: the update is skipped (parameters unchanged) and so is the
    copy's write: it still holds the parameter in fp16, and the step after (at a scale that fits) trains
    as the step without copies does."""
    x, y = _batch()
    base = _gpt()
    models = [copy.deepcopy(base), copy.deepcopy(base)]
    steps = [_step(m, x, c, mixed="fp16", loss_scale={"init_scale": 2.0**24}) for m, c in zip(models, (True, False))]
    before = {n: p.detach().clone() for n, p in models[0].named_parameters()}
    losses = [[float(s.run(x, y)) for _ in range(12)] for s in steps]
    assert losses[0] == losses[1]
    assert steps[0].loss_scale < 2.0**24  # (backed off: the first steps were skipped)
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.equal(p, q), name
    assert any(not torch.equal(p, before[n]) for n, p in models[0].named_parameters())
    for s in steps[0].params:
        if s.compute_copy is not None:
            p = models[0].get_parameter(s.key).detach().half()
            assert torch.equal(steps[0]._pack[s.compute_copy], s.source.apply(p) if s.source else p), s.key


@requires_interpreter
@pytest.mark.interpreter
def test_the_update_kernel_writes_the_copy():
    """Generated kernels (interpreted): each copy is written by a step that also updates its parameter, the
    plan has the steps of the plan that casts, less the casts (no update split in two), and two steps'
    losses (poisoned first) and parameters equal the reference engine's."""
    x, y = _batch()
    base = _gpt(layers=1)
    results = {}
    for engines in (("reference",), ("triton", "torch")):
        model = copy.deepcopy(base)
        step = _step(model, x, True, optimizer=SGD(0.5, momentum=0.9))
        step.build("cpu", engines=list(engines))
        losses = []
        for _ in range(2):
            pack = step.pack(x, target=y)
            pack[step.loss_uid].fill_(float("nan"))
            step.plan.execute(pack)
            losses.append(float(pack[step.loss_uid].reshape(())))
        results[engines] = (model, losses, step)
    model, losses, step = results[("triton", "torch")]
    writers = {}
    for s in step.plan.steps:
        outs = set(s.piece.outputs)
        for slot in step.params:
            if slot.compute_copy is not None and slot.compute_copy in outs:
                writers[slot.key] = slot.uid in outs
    copied = [s.key for s in step.params if s.compute_copy is not None]
    assert copied and sorted(writers) == sorted(copied) and all(writers.values()), writers
    casting = _step(copy.deepcopy(base), x, False, optimizer=SGD(0.5, momentum=0.9))
    casting.build("cpu", engines=["triton", "torch"])
    assert len(step.plan.steps) == len(casting.plan.steps) - len(copied)  # the casts' steps gone, no update split
    ref_model, ref_losses, _ = results[("reference",)]
    assert np.isfinite(losses).all()
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-2)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        moved = float((q - base.get_parameter(name)).detach().norm())
        assert float((p - q).norm()) <= 5e-2 * moved + 1e-6, name


@pytest.mark.gpu
@requires_cuda
def test_gpu_captured_step_refreshes_a_changed_copy_before_replay():
    """On CUDA, captured: replays equal run()s with copies and without; a parameter changed by torch
    between replays is cast again before the next replay (the loss of a fresh step on the changed module)."""
    torch.manual_seed(0)
    base = _gpt(vocab=97, d=64, heads=4, seq=32, layers=2).cuda()
    x = torch.randint(0, 97, (4, 32), device="cuda")
    y = torch.randint(0, 97, (4, 32), device="cuda")
    graphed, plain, without = (copy.deepcopy(base) for _ in range(3))
    sg, sp, sw = _step(graphed, x, True), _step(plain, x, True), _step(without, x, False)
    captured = sg.capture(x, y)
    for _ in range(3):
        got = float(captured.replay(x, y))
        assert got == float(sp.run(x, y))
        assert abs(got - float(sw.run(x, y))) <= 1e-6 * abs(got)
    weight = next(s.key for s in sg.params if s.compute_copy is not None)
    with torch.no_grad():
        graphed.get_parameter(weight).mul_(-1.0)
    fresh = _step(copy.deepcopy(graphed), x, False, optimizer=SGD(0.0))
    want = float(fresh.run(x, y))
    sg.optimizer.set(lr=0.0)
    assert abs(float(captured.replay()) - want) <= 1e-3 * abs(want)
