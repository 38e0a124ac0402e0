"""Training steps of modules imported with dynamic dims (`from_torch(..., dynamic_shapes=...)`): one
`train_step` built once and run at many batch sizes and sequence lengths (1, primes, the range's
ends), each step's loss, every gradient and every updated parameter compared with PyTorch's own step
in float64 (torch.optim, clip_grad_norm_), the step's outputs poisoned with NaN first; mixed precision
against the static step of the same shape; a shape outside the range is a typed error naming the dim;
generated kernels under Triton's interpreter for one small case."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
from torch.export import Dim  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph.frontends import from_torch  # noqa: E402
from opgraph.training import SGD, AdamW, train_step  # noqa: E402
from tests.frontends.test_torch_import_dynamic import MLP, Decoder, _tiny_lm  # noqa: E402
from tests.helpers import check_rule, requires_cuda, requires_interpreter  # noqa: E402

BATCH, SEQ = 6, 24
SHAPES = [(1, 1), (2, 7), (5, 13), (BATCH, SEQ), (1, SEQ), (BATCH, 1)]  # ones, primes, the range's ends


def dims(batch: int = BATCH, seq: int = SEQ) -> dict:
    return {0: Dim("batch", min=1, max=batch), 1: Dim("seq", min=1, max=seq)}


def keep_gradients(g, slot, grad):
    """A gradient hook making each parameter's gradient an output of the step (to compare it)."""
    return grad.set_output(True)


class Run:
    """One module trained twice: by opgraph's dynamic train_step and by PyTorch (a copy), step by step."""

    def __init__(self, model, example, dynamic_shapes, loss, optimizer, torch_optimizer, clip=None, **options):
        self.model, self.ref = model, copy.deepcopy(model)
        self.imported = from_torch(model.train(), example, dynamic_shapes=dynamic_shapes)
        assert self.imported.dynamic
        self.step = train_step(
            self.imported, loss=loss, optimizer=optimizer, grad_clip_norm=clip, on_gradient=[keep_gradients], **options
        )
        self.loss = loss
        self.clip = clip
        self.opt = torch_optimizer(self.ref.parameters())

    def torch_loss(self, out, target):
        if self.loss == "mse":
            return F.mse_loss(out, target)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    def check(self, x, target, rtol, atol, param_atol=None):
        """One step of each; the loss, every gradient and every parameter compared."""
        pack = self.step.pack(x, target)
        poisoned = [self.step.loss_uid, *(s.grad_uid for s in self.step.params)]
        for uid in poisoned:
            pack[uid].fill_(math.nan)
        loss = self.step.run(x, target)

        self.opt.zero_grad()
        want = self.torch_loss(self.ref(x), target)
        want.backward()
        grads = {k: p.grad.detach().clone() for k, p in self.ref.named_parameters()}
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.ref.parameters(), self.clip)
        self.opt.step()

        torch.testing.assert_close(loss, want.detach(), rtol=rtol, atol=atol)
        for slot in self.step.params:
            got = pack[slot.grad_uid]
            g = grads[slot.key]
            expected = slot.source.apply(g) if slot.source is not None else g
            torch.testing.assert_close(
                got, expected.reshape(got.shape), rtol=rtol, atol=atol, msg=lambda m, k=slot.key: f"{k}: {m}"
            )
        for (name, p), q in zip(self.model.named_parameters(), self.ref.parameters()):
            torch.testing.assert_close(
                p.detach(), q.detach(), rtol=rtol, atol=param_atol or atol, msg=lambda m, k=name: f"{k}: {m}"
            )


# -- float64 against torch.optim ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "optimizer,torch_optimizer,clip",
    [
        (SGD(0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), None),
        (AdamW(1e-2, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), 0.05),
    ],
    ids=["sgd-momentum", "adamw-clip"],
)
def test_mlp_trains_at_every_shape_as_pytorch(optimizer, torch_optimizer, clip):
    torch.manual_seed(0)
    run = Run(
        MLP().double(),
        (torch.randn(3, 5, 8, dtype=torch.float64),),
        (dims(),),
        "mse",
        optimizer,
        torch_optimizer,
        clip,
    )
    built = run.step.graph.final
    assert set(built.symbols) == {"batch", "seq"}
    for b, t in SHAPES:
        x, target = torch.randn(b, t, 8, dtype=torch.float64), torch.randn(b, t, 8, dtype=torch.float64)
        run.check(x, target, rtol=1e-9, atol=1e-11)
    assert run.step.graph.final is built  # one step graph for every shape


def test_decoder_trains_with_cross_entropy_and_adamw_at_every_shape():
    """Embeddings (a position table read by arange of the length), causal SDPA, layernorm, RMSNorm,
    a SiLU MLP; the cross-entropy's mean over batch * seq tokens; AdamW with clipping."""
    torch.manual_seed(0)
    run = Run(
        Decoder().double(),
        (torch.randint(0, 32, (3, 5)),),
        {"ids": dims()},
        "cross_entropy",
        AdamW(1e-2),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        clip=0.5,
    )
    for b, t in SHAPES:
        run.check(torch.randint(0, 32, (b, t)), torch.randint(0, 32, (b, t)), rtol=1e-8, atol=1e-10, param_atol=1e-9)


def test_transformers_llama_trains_with_dynamic_batch_and_length():
    """transformers' LlamaForCausalLM from a tiny config (its RMSNorm and rotary tables in float32, as
    the traced program casts: float32's precision), SGD with momentum, at 1, primes and the ends."""
    run = Run(
        _tiny_lm("llama"),
        (torch.randint(0, 64, (2, 6)),),
        ({0: Dim("batch", min=1, max=4), 1: Dim("seq", min=1, max=32)},),
        "cross_entropy",
        SGD(0.05, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    )
    for b, t in [(1, 1), (3, 7), (4, 32), (2, 13)]:
        run.check(torch.randint(0, 64, (b, t)), torch.randint(0, 64, (b, t)), rtol=1e-4, atol=1e-6)


def test_cnn_with_a_dynamic_batch_trains_as_pytorch():
    """conv_dgrad / conv_wgrad and pooling backward with a dynamic batch (N only)."""

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 5, 3, stride=2)
            self.fc = nn.Linear(5 * 3 * 3, 7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.max_pool2d(torch.relu(self.c1(x)), 2)
            return self.fc(F.avg_pool2d(torch.relu(self.c2(y)), 1).flatten(1))

    torch.manual_seed(0)
    run = Run(
        CNN().double(),
        (torch.randn(3, 3, 16, 16, dtype=torch.float64),),
        ({0: Dim("batch", min=1, max=9)},),
        "cross_entropy",
        SGD(0.1, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    )
    for n in [1, 5, 9, 2]:
        run.check(torch.randn(n, 3, 16, 16, dtype=torch.float64), torch.randint(0, 7, (n,)), rtol=1e-9, atol=1e-11)


class Tokens(nn.Module):
    """A learned position table read as pos[:, :seq] (a slice of a parameter to a dynamic stop) and a
    class token expanded over the batch, concatenated along the dynamic length."""

    def __init__(self, rows: int = 20) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, rows, 8))
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return self.fc(torch.cat([self.cls.expand(b, -1, -1), x + self.pos[:, :t]], dim=1))


def test_a_position_table_sliced_to_the_length_trains_whole():
    torch.manual_seed(0)
    run = Run(
        Tokens().double(),
        (torch.randn(3, 5, 8, dtype=torch.float64),),
        ({0: Dim("batch", min=1, max=6), 1: Dim("seq", min=1, max=19)},),
        "mse",
        SGD(0.1, momentum=0.9),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    )
    for b, t in [(1, 1), (4, 7), (6, 19), (2, 3)]:
        x = torch.randn(b, t, 8, dtype=torch.float64)
        run.check(x, torch.randn(b, t + 1, 8, dtype=torch.float64), rtol=1e-9, atol=1e-11)
    seq = og.Dim("seq", 1, 19)
    g = og.Graph(io_data_type=og.DataType.FLOAT)
    table = g.tensor(dim=[10, 8], name="table")  # shorter than the longest sequence
    g.slice(table, [slice(0, seq)], name="rows").set_output(True)
    with pytest.raises(og.ShapeError) as err:
        g.validate()
    check_rule(err.value, "slice.dynamic", "table", "rows")


# -- mixed precision: the dynamic step at a shape is the static step of that shape ----------------------


@pytest.mark.parametrize("mixed", ["bf16", "fp16"])
def test_mixed_precision_step_equals_the_static_step_of_each_shape(mixed):
    """Autocast's casts, fp32 master weights, AdamW, clipping (and fp16's loss scale): the dynamic
    step at a shape does what the step of a static import of that shape does."""
    torch.manual_seed(0)
    model = MLP().float()

    def make(module, example, dynamic_shapes=None):
        imported = from_torch(module.train(), (example,), dynamic_shapes=dynamic_shapes)
        return train_step(imported, loss="mse", optimizer=AdamW(1e-2), mixed_precision=mixed, grad_clip_norm=1.0)

    dynamic_model = copy.deepcopy(model)
    dynamic = make(dynamic_model, torch.randn(3, 5, 8), (dims(),))
    for b, t in [(1, 1), (5, 13), (BATCH, SEQ), (2, 7)]:
        x, target = torch.randn(b, t, 8), torch.randn(b, t, 8)
        static_model = copy.deepcopy(dynamic_model)
        static = make(static_model, x)
        static.load_state_dict(dynamic.state_dict())  # (the optimizer state and step count so far)
        want = static.run(x, target)
        got = dynamic.run(x, target)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for p, q in zip(dynamic_model.parameters(), static_model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        assert dynamic.step_count == static.step_count
        assert dynamic.loss_scale == static.loss_scale


# -- refusals -------------------------------------------------------------------------------------------


def test_a_shape_outside_the_range_is_a_typed_error_naming_the_dim():
    torch.manual_seed(0)
    model = MLP().double()
    step = train_step(
        from_torch(model.train(), (torch.randn(3, 5, 8, dtype=torch.float64),), dynamic_shapes=(dims(),)),
        loss="mse",
        optimizer=SGD(0.1),
    )
    before = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(BATCH + 1, 3, 8, dtype=torch.float64)
    with pytest.raises(og.VariantPackError) as err:
        step.run(x, torch.randn_like(x))
    check_rule(err.value, "pack.dim_range", "batch")
    assert str(BATCH) in str(err.value)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(og.VariantPackError) as err:
        step.run(x, torch.randn(2, 4, 8, dtype=torch.float64))
    check_rule(err.value, "training.target_shape", "seq")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # nothing ran


# -- generated kernels (Triton's interpreter) -------------------------------------------------------


@requires_interpreter
def test_generated_kernels_train_at_two_shapes_as_the_reference_engine():
    torch.manual_seed(0)
    model = MLP(4, 8).float()
    steps = {}
    models = {}
    for engines in (("triton", "reference"), ("reference",)):
        models[engines] = copy.deepcopy(model)
        imported = from_torch(models[engines].train(), (torch.randn(2, 3, 4),), dynamic_shapes=(dims(5, 7),))
        steps[engines] = train_step(imported, loss="mse", optimizer=SGD(0.1, momentum=0.9))
        steps[engines].build("cpu", engines=list(engines))
    for b, t in [(1, 1), (3, 7)]:
        x, target = torch.randn(b, t, 4), torch.randn(b, t, 4)
        losses = [steps[e].run(x, target) for e in steps]
        torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
        for p, q in zip(*(models[e].parameters() for e in steps)):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


# -- CUDA graphs: one captured step per shape ---------------------------------------------------------


class _Replays:
    """A stand-in for torch.cuda.CUDAGraph (counts replays)."""

    def __init__(self) -> None:
        self.count = 0

    def replay(self) -> None:
        self.count += 1

    def reset(self) -> None:
        self.count = -1


def test_a_captured_step_replays_only_at_its_shape():
    from opgraph.training.step import CapturedStep

    torch.manual_seed(0)
    step = train_step(
        from_torch(MLP().double().train(), (torch.randn(3, 5, 8, dtype=torch.float64),), dynamic_shapes=(dims(),)),
        loss="mse",
        optimizer=SGD(0.1),
    )
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    pack = step.pack(x, torch.randn_like(x))
    graph = _Replays()
    captured = CapturedStep(step, graph, {"batch": 2, "seq": 3}, {u: pack[u] for u in step._dynamic_uids()})
    captured.replay(x, torch.randn_like(x))
    assert graph.count == 1
    other = torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(og.VariantPackError) as err:
        captured.replay(other, torch.randn_like(other))
    check_rule(err.value, "training.capture_shape", "seq")
    assert "batch=2 seq=3" in str(err.value)
    assert graph.count == 1
    for b in range(1, BATCH + 1):  # other shapes run (and push the captured one out of the step's LRU)
        for t in (1, 2):
            step.pack(torch.randn(b, t, 8, dtype=torch.float64), torch.randn(b, t, 8, dtype=torch.float64))
    captured.replay(x, torch.randn_like(x))  # the captured buffers again, bound and filled
    assert all(step._pack[u] is captured.buffers[u] for u in captured.buffers)
    assert torch.equal(step._pack[step.imported.inputs[0].uid], x)
    captured.release()  # the graph freed (before a process group's teardown): a replay is a typed error
    assert graph.count == -1 and captured.graph is None
    with pytest.raises(og.GraphError) as err:
        captured.replay(x, torch.randn_like(x))
    check_rule(err.value, "training.capture_released")
    captured.release()  # (twice is harmless)


@pytest.mark.gpu
@requires_cuda
def test_gpu_captured_steps_at_two_shapes_match_eager_steps():
    torch.manual_seed(0)
    model = MLP().cuda()
    ref = copy.deepcopy(model)
    imported = from_torch(
        model.train(), (torch.randn(3, 5, 8, device="cuda"),), dynamic_shapes=(dims(),), allow_tf32=False
    )
    step = train_step(imported, loss="mse", optimizer=SGD(0.1))
    ref_step = train_step(
        from_torch(ref.train(), (torch.randn(3, 5, 8, device="cuda"),), dynamic_shapes=(dims(),), allow_tf32=False),
        loss="mse",
        optimizer=SGD(0.1),
    )
    shapes = [(2, 7), (6, 24)]
    batches = {s: (torch.randn(*s, 8, device="cuda"), torch.randn(*s, 8, device="cuda")) for s in shapes}
    captured = {s: step.capture(*batches[s]) for s in shapes}
    for _ in range(2):
        for s in shapes:
            x, target = torch.randn(*s, 8, device="cuda"), torch.randn(*s, 8, device="cuda")
            got = captured[s].replay(x, target).clone()
            want = ref_step.run(x, target)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
