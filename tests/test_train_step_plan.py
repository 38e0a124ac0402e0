"""The structure of a training step's graph and plan where it decides device time (issue 17's GPT-2
analysis, bench/results/2026-11-25-gpt2-plan-analysis.md): the attention backward reads the
forward's O and Stats (no second attention forward per layer), checked on the graph in float64 and on
the generated kernels under the interpreter against the reference engine in bf16 mixed precision."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import opgraph as og
from opgraph.training import SGD, train_step

from .helpers import requires_interpreter

torch = pytest.importorskip("torch")


def sdpa_gpt(dtype, layers=2):
    from .frontends.gpt_models import GPT

    torch.manual_seed(0)
    return GPT(attention="sdpa", layers=layers).to(dtype).train()


def _two_steps_each(base, x, y, loss, optimizer, **options):
    """Two training steps of a copy of `base` per engine set (the reference engine; generated kernels
    and torch), each loss poisoned before its execute: (models, losses, steps) by engine set."""
    models, losses, steps = {}, {}, {}
    for engines in (("reference",), ("triton", "torch")):
        model = models[engines] = copy.deepcopy(base)
        step = steps[engines] = train_step(og.from_torch(model, (x,)), loss, optimizer, **options)
        step.build("cpu", engines=list(engines))
        losses[engines] = []
        for _ in range(2):
            pack = step.pack(x, target=y)
            pack[step.loss_uid].fill_(float("nan"))
            step.plan.execute(pack)
            losses[engines].append(float(pack[step.loss_uid].reshape(())))
    return models, losses, steps


@requires_interpreter
@pytest.mark.interpreter
def test_cross_entropy_over_flattened_logits_reads_them_in_place():
    """A language model's logits [batch, tokens, classes] flattened to rows before the loss (Hugging
    Face's loss, the zoo's Llama): the loss's row reductions read the flatten in place, the max in one
    step and the sum of exps with the target's logit in another, and its gradient is one pass over the
    logits after the per-row weights. Before: the flatten copied the logits, and the exps and the picked
    logit were each written out full-size for a reduction of their own, and the gradient's difference
    too (the mean's count was ordered after it). Loss (poisoned first) and parameters equal the reference
    engine's over two steps."""
    torch.manual_seed(0)
    base = (
        torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 7), torch.nn.Flatten(0, 1))
        .float()
        .train()
    )
    x = torch.randn(2, 4, 6)
    y = torch.randint(0, 7, (8,))
    y[3] = -100
    models, losses, steps = _two_steps_each(base, x, y, "cross_entropy", SGD(0.1, momentum=0.9))
    plan = steps[("triton", "torch")].plan
    full = [s for s in plan.steps if any(plan.graph.tensors[u].numel == 56 for u in s.piece.inputs)]
    names = [{n.name for n in s.piece.nodes} for s in full]
    loss_steps = [n for n in names if any(x.startswith("ce.") for x in n)]
    assert [s.config.knob("template") for s in full if {n.name for n in s.piece.nodes} in loss_steps] == [
        "reduction",
        "reduction",
        "pointwise",
    ], names
    assert "ce.max" in loss_steps[0] and {"ce.sum", "ce.picked"} <= loss_steps[1], loss_steps
    assert {"ce.bwd_diff", "ce.dlogits"} <= loss_steps[2], loss_steps
    assert not [n for n in names if n <= {"flatten", "flatten~1", "flatten~2", "flatten~3"}], names  # no copy
    got, want = losses[("triton", "torch")], losses[("reference",)]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(models[("triton", "torch")].parameters(), models[("reference",)].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _attention_nodes(final):
    fwd = [n for n in final.nodes if n.kind == "sdpa"]
    bwd = [n for n in final.nodes if n.kind == "sdpa_backward"]
    return fwd, bwd


def test_sdpa_backward_reads_the_forward_o_and_stats():
    """One sdpa per layer in the step graph (the forward, with Stats); each sdpa_backward reads that
    node's O and Stats. Before: a stat-less forward sdpa, and the backward graph ran the attention
    forward again (an `sdpa_recompute` node per layer) for O and Stats."""
    layers = 2
    model = sdpa_gpt(torch.float64, layers)
    idx = torch.randint(0, 17, (3, 8))
    imported = og.from_torch(model, (idx,))
    assert not imported.report.custom_ops, imported.report
    step = train_step(imported, "cross_entropy", SGD(0.1, momentum=0.9))
    final = step.graph.final
    fwd, bwd = _attention_nodes(final)
    assert len(fwd) == layers and len(bwd) == layers, [n.name for n in fwd + bwd]
    assert not [n for n in final.nodes if "sdpa_recompute" in n.name]
    saved = {(n.output("o"), n.output("stats")) for n in fwd}
    assert all(uid is not None for pair in saved for uid in pair)
    assert {(n.input("o"), n.input("stats")) for n in bwd} == saved
    # the saved Stats stay internal to the step (not an output the caller must bind)
    assert not {n.output("stats") for n in fwd} & set(final.outputs)


def test_mixed_precision_split_gradient_is_not_copied():
    """bf16 mixed precision: the gradient of the fused qkv projection's split (one concatenate of the
    q, k, v gradients) is written in the forward's type, so no identity op copies it to the same type
    before the bias and weight gradients read it (before: one [B, T, 3d] copy per layer)."""
    model = sdpa_gpt(torch.float32)
    idx = torch.randint(0, 17, (3, 8))
    step = train_step(og.from_torch(model, (idx,)), "cross_entropy", SGD(0.1), mixed_precision="bf16")
    final = step.graph.final
    concats = [n for n in final.nodes if n.kind == "concatenate"]
    assert len(concats) == 2, [n.name for n in concats]  # one per layer
    assert all(final.tensors[n.output_uids()[0]].data_type is og.DataType.BFLOAT16 for n in concats)
    copies = [
        n.name
        for n in final.nodes
        if n.kind == "pointwise"
        and n.op.mode.name == "IDENTITY"
        and final.tensors[n.input_uids()[0]].data_type is final.tensors[n.output_uids()[0]].data_type
    ]
    assert not copies, copies


def test_sdpa_step_still_trains_like_torch_in_float64():
    """The saved O and Stats give PyTorch's gradients: two SGD-with-momentum steps of a GPT with
    F.scaled_dot_product_attention, float64 on the reference engine, within 1e-12 (not AdamW: the key
    bias's true gradient is zero, softmax ignores it, and AdamW scales its rounding noise up to lr)."""
    model = sdpa_gpt(torch.float64)
    ref = copy.deepcopy(model)
    idx = torch.randint(0, 17, (3, 8))
    y = torch.randint(0, 17, (3, 8))
    step = train_step(og.from_torch(model, (idx,)), "cross_entropy", SGD(0.1, momentum=0.9))
    topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        got = step.run(idx, y)
        topt.zero_grad()
        want = torch.nn.functional.cross_entropy(ref(idx).reshape(-1, 17), y.reshape(-1))
        want.backward()
        topt.step()
        assert abs(float(got) - float(want.detach())) <= 1e-12 * float(want.detach())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        err = float((p - q).norm() / q.norm())
        assert err <= 1e-12, (name, err)


@requires_interpreter
@pytest.mark.interpreter
def test_sdpa_step_on_generated_kernels_matches_the_reference_engine():
    """bf16 mixed precision, SGD with momentum (AdamW turns the sign of near-zero bf16 gradients into
    whole-lr differences; bench/gpt.py's check says why): the plan on generated kernels (interpreted) runs one attention
    forward and one attention backward kernel per layer, and its loss (output poisoned with NaN
    first) and updated parameters equal the reference engine's over two steps within bf16 rounding."""
    layers = 1
    base = sdpa_gpt(torch.float32, layers)
    idx = torch.randint(0, 17, (2, 8))
    y = torch.randint(0, 17, (2, 8))
    models, losses, steps = _two_steps_each(
        base, idx, y, "cross_entropy", SGD(0.5, momentum=0.9), mixed_precision="bf16"
    )
    templates = [s.config.knob("template") for s in steps[("triton", "torch")].plan.steps]
    assert templates.count("attention") == layers and templates.count("attention_bwd") == layers, templates
    got, want = losses[("triton", "torch")], losses[("reference",)]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-2)
    for (name, p), q in zip(models[("triton", "torch")].named_parameters(), models[("reference",)].parameters()):
        moved = float((q - base.get_parameter(name)).norm())
        assert float((p - q).norm()) <= 5e-2 * moved + 1e-6, name  # the updates agree to bf16 accuracy


@requires_interpreter
@pytest.mark.interpreter
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_reads_the_logits_once_in_the_forward(smoothing):
    """The loss's row reductions over the logits (sum of exps, the target's logit, label smoothing's
    mean) run as one kernel: after the GEMM that writes the logits (and their row max), one step reads
    them for the loss and one for its gradient. Before: a reduction kernel per row reduction. Loss
    (poisoned first) and parameters equal the reference engine's over two steps, an ignored target
    included."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 7)).float().train()
    x = torch.randn(8, 6)
    y = torch.randint(0, 7, (8,))
    y[3] = -100
    loss = og.training.CrossEntropy(label_smoothing=smoothing)
    models, losses, steps = _two_steps_each(base, x, y, loss, SGD(0.1, momentum=0.9))
    step = steps[("triton", "torch")]
    forward, backward = [
        {n.name for n in s.piece.nodes} for s in step.plan.steps if step.out_uid in s.piece.inputs
    ]  # exactly two steps read the logits
    assert {"ce.sum", "ce.picked"} | ({"ce.mean_logit"} if smoothing else set()) <= forward, forward
    assert "ce.dlogits" in backward, backward
    got, want = losses[("triton", "torch")], losses[("reference",)]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for p, q in zip(models[("triton", "torch")].parameters(), models[("reference",)].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
