"""The model zoo (zoo_models.py): models from transformers, timm and torchvision, tiny sizes, random
weights, imported with from_torch and run on the reference engine against PyTorch in fp32; eight of them
through one AdamW training step against torch.optim.AdamW. Marked gpu: the same on CUDA, PyTorch and the
import both in fp32 without TF32. Each row counts the custom ops (aten ops run opaquely) and the steps a
plan for the GPU engines (triton, torch) puts on the torch engine.

`python -m tests.frontends.test_torch_zoo [names...]` prints the table (tests/frontends/ZOO.md).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")

import opgraph as og  # noqa: E402

from ..helpers import requires_cuda  # noqa: E402
from .zoo_models import MODELS, TRAINED, Missing, build  # noqa: E402

RTOL = 1e-4  # fp32 against PyTorch's fp32: max |diff| / max |reference|

# torch-engine steps of a plan for the GPU engines: none, except in the rows of timm and torchvision
# models, which `make test` does not install (their bounds: the counts ZOO.md recorded before the
# generated kernels took layernorms of views, cumsum, view copies and attention biases read through views)
TORCH_STEPS_AT_MOST = {
    "tv_swin_t": 14,
    "tv_vit": 6,
    "timm_vit_tiny": 8,
    "timm_convnext_atto": 9,
    "timm_mobilevit_xxs": 18,
    "timm_swin": 11,
}

# models that fail for a reason another change fixes (the test then expects the failure)
XFAIL: dict[str, str] = {}
XFAIL_TRAIN: dict[str, str] = {}


@dataclass
class Row:
    name: str
    library: str
    family: str
    imports: bool = False
    rel_error: float | None = None
    custom_ops: int | None = None
    torch_steps: int | None = None
    steps: int | None = None
    error: str = ""

    def cells(self) -> list[str]:
        err = "" if self.rel_error is None else f"{self.rel_error:.1e}"
        return [
            self.name,
            self.library,
            self.family,
            "yes" if self.imports else "no",
            err,
            "" if self.custom_ops is None else str(self.custom_ops),
            "" if self.torch_steps is None else f"{self.torch_steps} / {self.steps}",
            self.error,
        ]


def rel_error(got, want) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))


def torch_engine_steps(imported) -> tuple[int, int]:
    """(torch-engine steps, steps) of a plan for the GPU engines, planned on the CPU (nothing compiled)."""
    plan = imported.graph.build(device="cpu", engines=["triton", "torch"], compile="lazy")
    return sum(s.config.engine == "torch" for s in plan.steps), len(plan.steps)


def measure(name: str) -> Row:
    torch.manual_seed(0)
    entry = build(name)
    model = entry.module.eval()
    row = Row(name, entry.library, entry.family)
    try:
        imported = og.from_torch(model, entry.inputs)
    except og.GraphError as err:
        row.error = str(err).splitlines()[0][:200]
        return row
    row.imports = True
    row.custom_ops = len(imported.report.custom_ops)
    with torch.no_grad():
        want = model(*entry.inputs)
    got = imported.run(*entry.inputs)
    row.rel_error = rel_error(got, want)
    row.torch_steps, row.steps = torch_engine_steps(imported)
    return row


def _entry(name: str):
    try:
        torch.manual_seed(0)
        return build(name)
    except Missing as why:
        pytest.skip(str(why))


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_imports_and_matches_pytorch(name):
    _entry(name)  # skips when the library is absent
    row = measure(name)
    print(" | ".join(row.cells()))
    if name in XFAIL and (row.rel_error is None or row.rel_error > RTOL):
        pytest.xfail(XFAIL[name])
    assert row.imports, row.error
    assert row.rel_error is not None and row.rel_error <= RTOL, f"{name}: {row.rel_error:.2e} relative"
    assert row.torch_steps is not None and row.torch_steps <= TORCH_STEPS_AT_MOST.get(name, 0), (
        f"{name}: {row.torch_steps} torch-engine steps"
    )


@pytest.mark.parametrize("name", ["vit", "deit"])
def test_class_token_models_keep_the_batch_axis_outermost(name):
    """ViT and DeiT concatenate a class token expanded over the batch with the patch embeddings: no
    tensor of the imported graph is laid out batch-innermost (the expand's stride 0 once made the
    residual stream so, and every GEMM read it as a gather: 8x slower on an H200)."""
    entry = _entry(name)
    final = og.from_torch(entry.module.eval(), entry.inputs).graph.final
    for t in final.tensors.values():
        if len(t.dim) >= 3 and t.dim[0] > 1 and any(d > 1 for d in t.dim[1:]):
            assert t.stride[0] != 1, (t.name, t.dim, t.stride)


@pytest.mark.parametrize("name", ["vit", "bert"])
def test_class_token_pooling_gradient_runs_in_a_generated_kernel(name):
    """x[:, 0]'s gradient (ViT's classifier, BERT's pooler read the first token) is a slice_backward:
    the generated pointwise kernels run it (zeros outside the slice), not the torch engine."""
    entry = _entry(name)
    imported = og.from_torch(entry.module.train(), entry.inputs)
    graph = og.training.train_step(imported, mixed_precision="bf16").graph
    plan = graph.build(device="cpu", engines=["triton", "torch"])
    kinds = {s.config.engine: set() for s in plan.steps}
    for s in plan.steps:
        kinds[s.config.engine] |= set(s.piece.kinds)
    assert "slice_backward" in kinds["triton"] and "slice_backward" not in kinds.get("torch", set())


@pytest.mark.parametrize("name", TRAINED)
def test_zoo_model_trains_one_adamw_step(name):
    _train_one_adamw_step(name, "cpu")


@pytest.mark.parametrize("name", ["llama", "swin", "bert"])
def test_zoo_training_steps_have_no_torch_engine_steps(name):
    """A training step's plan for the GPU engines (planned on the CPU, nothing compiled) runs every step in
    generated kernels: the token embedding's gradient (a scatter-add), Swin's patch merging's gradient (strided
    slices' backward), BERT's position and type tables' gradients (issue 40: none on the torch engine)."""
    entry = _entry(name)
    imported = og.from_torch(entry.module.train(), entry.inputs)
    step = og.training.train_step(imported, "cross_entropy", og.training.AdamW(1e-3))
    plan = step.graph.build(device="cpu", engines=["triton", "torch"], compile="lazy")
    torch_steps = [s.piece.label() for s in plan.steps if s.config.engine == "torch"]
    assert not torch_steps, torch_steps


def _train_one_adamw_step(name: str, device: str) -> None:
    entry = _entry(name)
    model = entry.module.train().to(device)
    inputs, target = tuple(x.to(device) for x in entry.inputs), entry.target.to(device)
    reference = copy.deepcopy(model)
    imported = og.from_torch(model, inputs)
    assert device == "cpu" or not imported.allow_tf32  # (fp32_torch: PyTorch's fp32 without TF32)
    # eps 1e-3: AdamW's first update is about lr * sign(grad), so gradients that are zero in exact
    # arithmetic (a key bias's: softmax ignores a constant added to every score) and round to noise
    # would move by +-lr in either implementation; eps keeps their updates near zero
    hyper = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-3, weight_decay=0.05)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    try:
        step = og.training.train_step(imported, "cross_entropy", og.training.AdamW(**hyper))
        loss = step.run(*inputs, target=target)
        opt = torch.optim.AdamW(reference.parameters(), **hyper)
        want = torch.nn.functional.cross_entropy(reference(*inputs), target)
        want.backward()
        opt.step()
        assert rel_error(loss.reshape(()), want.detach()) <= RTOL
        params = dict(reference.named_parameters())
        for key, p in model.named_parameters():
            update, want_update = p.detach() - before[key], params[key].detach() - before[key]
            scale = max(float(want_update.abs().max()), hyper["lr"])  # (zero gradients move by ~0)
            assert float((update - want_update).abs().max()) <= 1e-3 * scale, key
    except (og.GraphError, AssertionError):
        if name in XFAIL_TRAIN:
            pytest.xfail(XFAIL_TRAIN[name])
        raise


@pytest.fixture
def fp32_torch():
    """PyTorch in full fp32 (no TF32): what an import then asks of opgraph's plans too."""
    from opgraph.engines.torch_engine.precision import exact_math

    with exact_math(True):  # both of PyTorch's TF32 APIs kept consistent (its legacy getters raise otherwise)
        yield


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_model_matches_pytorch_on_cuda(name, fp32_torch):
    """The zoo built for the GPU engines, fp32 without TF32 on both sides, within 1e-4 of PyTorch."""
    entry = _entry(name)
    model = entry.module.eval().cuda()
    inputs = tuple(x.cuda() for x in entry.inputs)
    imported = og.from_torch(model, inputs)
    assert not imported.allow_tf32
    with torch.no_grad():
        want = model(*inputs)
    got = imported.run(*inputs)
    plan = imported.plan("cuda")
    torch_steps = sum(s.config.engine == "torch" for s in plan.steps)
    print(
        f"{name}: {rel_error(got, want):.1e} relative, {len(imported.report.custom_ops)} custom ops, "
        f"{torch_steps} / {len(plan.steps)} torch-engine steps"
    )
    assert rel_error(got, want) <= RTOL


# torch-engine steps for the GPU engines: none (the rotary embedding, the embedding lookup and the
# logits' flatten of the decoder LMs; OPT's layernorms of reshapes; the class token's and ConvNeXt's
# channels-last layernorms; RoBERTa's cumsum; Swin's windows and MobileViT's patches are generated kernels)
GPU_TORCH_STEPS = {
    "llama": 0,
    "qwen2": 0,
    "mistral": 0,
    "opt": 0,
    "roberta": 0,
    "vit": 0,
    "convnext": 0,
    "swin": 0,
    "mobilevit": 0,
}


@pytest.mark.interpreter
@pytest.mark.parametrize("name", list(GPU_TORCH_STEPS))
def test_model_runs_without_torch_engine_steps_on_the_interpreter(name):
    """The same plan's kernels under Triton's interpreter, against PyTorch."""
    entry = _entry(name)
    model = entry.module.eval()
    imported = og.from_torch(model, entry.inputs)
    with torch.no_grad():
        want = model(*entry.inputs)
    got = imported.run(*entry.inputs, engines=["triton", "torch"])
    plan = imported.plan("cpu", engines=["triton", "torch"])
    assert rel_error(got, want) <= RTOL
    assert sum(s.config.engine == "torch" for s in plan.steps) == GPU_TORCH_STEPS[name], plan.describe()


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", list(GPU_TORCH_STEPS))
def test_model_runs_without_torch_engine_steps_on_cuda(name, fp32_torch):
    """Built for CUDA with the GPU engines (triton, torch), the model matches PyTorch and puts no step
    on the torch engine (issue 40)."""
    entry = _entry(name)
    model = entry.module.eval().cuda()
    inputs = tuple(x.cuda() for x in entry.inputs)
    imported = og.from_torch(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
    got = imported.run(*inputs, engines=["triton", "torch"])
    plan = imported.plan("cuda", engines=["triton", "torch"])
    assert rel_error(got, want) <= RTOL
    on_torch = [s.piece.kinds for s in plan.steps if s.config.engine == "torch"]
    assert len(on_torch) == GPU_TORCH_STEPS[name], on_torch


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", TRAINED)
def test_zoo_model_trains_one_adamw_step_on_cuda(name, fp32_torch):
    """The training step's plan on the GPU follows the import's fp32 precision (TF32 off, as PyTorch here)."""
    _train_one_adamw_step(name, "cuda")


def main(names: list[str]) -> None:
    header = ["model", "library", "family", "imports", "max rel error", "custom ops", "torch-engine steps", "error"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in names or list(MODELS):
        try:
            row = measure(name)
        except Missing as why:
            row = Row(name, "", "", error=f"skipped: {why}"[:120])
        print("| " + " | ".join(row.cells()) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
