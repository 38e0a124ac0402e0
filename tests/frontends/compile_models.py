"""Models and a comparison harness shared by the torch.compile backend and opgraph.compile tests:
an MLP, a CNN with batchnorm, the project's GPT and (when installed) a tiny transformers model, run by
an opgraph-compiled copy and by eager PyTorch side by side. float64 throughout: opgraph's CPU
reference engine computes in float64, so both sides agree to rounding and 20 AdamW steps can be held
to a tight tolerance."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .gpt_models import GPT
from .zoo_models import TokenLogits

DT = torch.float64


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.GELU(), nn.Linear(12, 3))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 6, 3, stride=2),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(6, 3),
    )


def gpt() -> nn.Module:
    return GPT(vocab=17, d=16, heads=2, seq=8, layers=2)


def tiny_transformer() -> nn.Module | None:
    """A 2-layer GPT-2 from transformers with random weights, returning the logits (None without
    transformers)."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    config = GPT2Config(
        vocab_size=19,
        n_positions=8,
        n_embd=16,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
    )
    return TokenLogits(GPT2LMHeadModel(config))


def tiny_llama() -> nn.Module | None:
    """A 2-layer Llama from transformers (GQA, rotary embedding, SDPA attention: AOTAutograd's graphs
    hold the attention kernel PyTorch picked and its backward), returning the logits (None without
    transformers)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    config = LlamaConfig(
        vocab_size=23,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8,
        attn_implementation="sdpa",
    )
    return TokenLogits(LlamaForCausalLM(config))


# name -> (model factory, batch factory(step) -> (inputs, target), loss(out, target))
def _images(step: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(4, 3, 8, 8, generator=g, dtype=DT),), torch.randint(0, 3, (4,), generator=g)


def _rows(step: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(200 + step)
    return (torch.randn(5, 6, generator=g, dtype=DT),), torch.randint(0, 3, (5,), generator=g)


def _tokens(vocab: int) -> Callable[[int], tuple[tuple[torch.Tensor], torch.Tensor]]:
    def make(step: int) -> tuple[tuple[torch.Tensor], torch.Tensor]:
        g = torch.Generator().manual_seed(300 + step)
        ids = torch.randint(0, vocab, (2, 8), generator=g)
        return (ids,), torch.randint(0, vocab, (2, 8), generator=g)

    return make


def _ce(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


CASES: dict[str, tuple[Callable[[], nn.Module | None], Callable[[int], Any]]] = {
    "mlp": (mlp, _rows),
    "cnn_batchnorm": (cnn, _images),
    "gpt": (gpt, _tokens(17)),
    "transformers_gpt2": (tiny_transformer, _tokens(19)),
    "transformers_llama": (tiny_llama, _tokens(23)),
}


# Llama computes its RMSNorm and rotary tables in float32 (casts in the traced program), the rest float64
TOLERANCE: dict[str, dict[str, float]] = {"transformers_llama": {"rtol": 1e-5, "final_rtol": 1e-5}}


def make_case(name: str) -> tuple[nn.Module, Callable[[int], Any]] | None:
    factory, batches = CASES[name]
    torch.manual_seed(0)
    model = factory()
    if model is None:
        return None
    return model.to(DT).train(), batches


def compare_training(
    model: nn.Module,
    batches: Callable[[int], Any],
    wrap: Callable[[nn.Module, tuple], Any],
    steps: int = 20,
    rtol: float = 1e-9,
    final_rtol: float = 1e-7,
) -> Any:
    """Train `model` (wrapped by `wrap(model, example_inputs)`) and an eager copy side by side with
    torch.optim.AdamW for `steps` steps: the first step's outputs and every gradient, each step's loss,
    and the final parameters and buffers (batchnorm running stats) must agree."""
    eager = copy.deepcopy(model)
    inputs, _ = batches(0)
    compiled = wrap(model, inputs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.01)
    for step in range(steps):
        inputs, target = batches(step)
        out, out_eager = compiled(*inputs), eager(*inputs)
        loss, loss_eager = _ce(out, target), _ce(out_eager, target)
        if step == 0:
            torch.testing.assert_close(out, out_eager, rtol=rtol, atol=rtol)
        loss.backward()
        loss_eager.backward()
        if step == 0:
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                assert p.grad is not None, f"no gradient for {name}"
                torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=rtol, msg=f"gradient of {name}")
        torch.testing.assert_close(loss, loss_eager, rtol=rtol, atol=rtol, msg=f"loss at step {step}")
        opt.step()
        opt_eager.step()
        opt.zero_grad()
        opt_eager.zero_grad()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=final_rtol, atol=final_rtol, msg=f"parameter {name} after {steps} steps")
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, rtol=final_rtol, atol=final_rtol, msg=f"buffer {name} after {steps} steps")
    return compiled


class _TwoResults(nn.Module):
    """Pooled conv features (bf16 under autocast: pooling runs in its input's type) and a layer norm of
    the input's channel means (fp32: no autocast op on the way)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.LayerNorm(3)

    def forward(self, x):
        pooled = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv(x)), 1).flatten(1)
        return pooled, self.norm(x.mean((2, 3)))


# float32 models and an input, for torch.autocast(bfloat16) on the CPU
AUTOCAST: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "mlp": lambda: (_case("mlp").float(), torch.randn(5, 6)),
    "cnn_batchnorm": lambda: (_case("cnn_batchnorm").float(), torch.randn(4, 3, 8, 8)),
    "gpt": lambda: (_case("gpt").float(), torch.randint(0, 17, (2, 8))),
    "two_results": lambda: (_TwoResults(), torch.randn(2, 3, 6, 6)),
}


def _case(name: str) -> nn.Module:
    case = make_case(name)
    assert case is not None
    return case[0]
