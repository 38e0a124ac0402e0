"""A character-level GPT trained through opgraph on the Python standard library's own sources, its loss
curve beside the same model trained by PyTorch.

The model is plain torch.nn (token embedding tied to the output projection, learned positions,
pre-LayerNorm blocks with causal self-attention and a GELU MLP), imported once with
`opgraph.from_torch`; `opgraph.training.train_step` turns it into one training-step graph: forward,
cross-entropy over the vocabulary, backward, global gradient-norm clipping and AdamW updating the
module's own parameters in place. The learning rate follows a cosine schedule written into a device
scalar before each step. A copy of the model is trained by PyTorch (autograd, clip_grad_norm_,
torch.optim.AdamW) on the same batches; the two curves are printed side by side.

    python examples/15_train_char_gpt.py              # CPU: a tiny model, 150 steps, about 50 s of CPU time
    python examples/15_train_char_gpt.py --gpu-size   # GPU: 6 layers, d=384, seq 256, batch 64, bf16,
                                                      # the step captured in a CUDA graph, 1500 steps

Attention is F.scaled_dot_product_attention (is_causal=True), which from_torch imports as opgraph's
sdpa op (a flash-attention kernel on the GPU, its backward through sdpa_backward); --attention explicit
writes it as matmul, mask and softmax instead. Exits non-zero (and prints MISMATCH) when the final loss misses
the stated target or the two curves part by more than the stated tolerance.
"""

import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import opgraph as og

ATTENTION = "sdpa"


def stdlib_text(limit: int) -> str:
    """The first `limit` characters of the standard library's .py files, in a fixed order."""
    root = os.path.dirname(os.__file__)
    parts, size = [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                text = f.read()
            parts.append(text)
            size += len(text)
            if size >= limit:
                break
    text = "".join(parts)[:limit]
    return "".join(c if 32 <= ord(c) < 127 or c == "\n" else "?" for c in text)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, attention: str) -> None:
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
            y = F.softmax(att.masked_fill(~self.causal[:t, :t], float("-inf")), dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, seq: int, layers: int, attention: str) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq, attention) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-size", action="store_true", help="the GPU configuration (bf16, CUDA graph)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--attention", default=ATTENTION, choices=["explicit", "sdpa"])
    args = ap.parse_args()
    gpu = args.gpu_size or (args.steps is not None and torch.cuda.is_available())
    device = "cuda" if gpu else "cpu"
    if not gpu:
        torch.set_num_threads(1)  # tiny tensors: threads only contend
    if gpu and not torch.cuda.is_available():
        print("--gpu-size needs a CUDA GPU")
        return 2
    if args.gpu_size:
        cfg = dict(
            d=384,
            heads=6,
            seq=256,
            layers=6,
            batch=64,
            steps=1500,
            lr=1e-3,
            chars=4_000_000,
            mixed="bf16",
            target=1.6,
            tolerance=0.05,
        )
    elif gpu:  # the quick GPU check the tests run
        cfg = dict(
            d=128,
            heads=4,
            seq=64,
            layers=2,
            batch=32,
            steps=200,
            lr=2e-3,
            chars=1_000_000,
            mixed="bf16",
            target=2.4,
            tolerance=0.05,
        )
    else:
        cfg = dict(
            d=48,
            heads=2,
            seq=32,
            layers=2,
            batch=16,
            steps=150,
            lr=3e-3,
            chars=300_000,
            mixed=None,
            target=2.6,
            tolerance=0.03,
        )
    if args.steps is not None:
        cfg["steps"] = args.steps
        cfg["target"] = cfg["target"] if args.steps >= 150 else 3.3
    text = stdlib_text(cfg["chars"])
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.int64)
    split = int(0.95 * len(data))
    print(
        f"{len(text)} characters of the standard library, vocabulary {len(chars)}; device {device}, "
        f"{cfg['layers']} layers d={cfg['d']} seq {cfg['seq']} batch {cfg['batch']}, "
        f"mixed precision {cfg['mixed']}, attention {args.attention}"
    )

    torch.manual_seed(0)
    model = CharGPT(len(chars), cfg["d"], cfg["heads"], cfg["seq"], cfg["layers"], args.attention).to(device)
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)

    def batch(source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(source) - cfg["seq"] - 1, (cfg["batch"],), generator=gen)
        x = torch.stack([source[s : s + cfg["seq"]] for s in starts])
        y = torch.stack([source[s + 1 : s + 1 + cfg["seq"]] for s in starts])
        return x.to(device), y.to(device)

    t0 = time.perf_counter()
    imported = og.from_torch(model.train(), (batch(data)[0],))
    step = og.training.train_step(
        imported,
        "cross_entropy",
        og.training.AdamW(cfg["lr"], weight_decay=0.1),
        mixed_precision=cfg["mixed"],
        grad_clip_norm=1.0,
    )
    print(
        f"imported and built the step graph in {time.perf_counter() - t0:.1f} s: "
        f"{len(step.graph.final.nodes)} ops; {imported.report.summary().splitlines()[0]}"
    )
    topt = torch.optim.AdamW(twin.parameters(), lr=cfg["lr"], weight_decay=0.1)

    def lr_at(i: int) -> float:
        warm = 20
        if i < warm:
            return cfg["lr"] * (i + 1) / warm
        return cfg["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (i - warm) / (cfg["steps"] - warm))))

    replay = None
    curve: list[tuple[float, float]] = []
    every = max(1, cfg["steps"] // 15)
    print(f"{'step':>5} {'lr':>9} {'opgraph':>9} {'PyTorch':>9}")
    t_og = t_torch = 0.0
    for i in range(cfg["steps"]):
        x, y = batch(data[:split])
        lr = lr_at(i)
        step.optimizer.set(lr=lr)
        for group in topt.param_groups:
            group["lr"] = lr
        t = time.perf_counter()
        if gpu and i == 1:
            replay = step.capture(x, y)  # from now on one CUDA-graph replay per step
        loss = replay.replay(x, y) if replay is not None else step.run(x, y)
        value = float(loss)
        t_og += time.perf_counter() - t
        t = time.perf_counter()
        topt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cfg["mixed"] == "bf16"):
            logits = twin(x)
        ref = F.cross_entropy(logits.float().reshape(-1, len(chars)), y.reshape(-1))
        ref.backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0)
        topt.step()
        ref_value = float(ref.detach())
        t_torch += time.perf_counter() - t
        curve.append((value, ref_value))
        if i % every == 0 or i == cfg["steps"] - 1:
            print(f"{i:5d} {lr:9.2e} {value:9.4f} {ref_value:9.4f}", flush=True)

    tail = max(1, cfg["steps"] // 10)
    final = sum(a for a, _ in curve[-tail:]) / tail
    final_ref = sum(b for _, b in curve[-tail:]) / tail
    with torch.no_grad():
        model.eval()
        x, y = batch(data[split:])
        val = float(F.cross_entropy(imported.run(x).float().reshape(-1, len(chars)), y.reshape(-1)))
    print(
        f"mean loss over the last {tail} steps: opgraph {final:.4f}, PyTorch {final_ref:.4f}; "
        f"held-out loss (opgraph forward) {val:.4f}; target <= {cfg['target']}"
    )
    print(
        f"time per step: opgraph {1e3 * t_og / cfg['steps']:.1f} ms, PyTorch {1e3 * t_torch / cfg['steps']:.1f} ms "
        f"(opgraph on {step.plan.device}, {len(step.plan.steps)} kernels per step"
        f"{', replayed from a CUDA graph' if replay is not None else ''})"
    )
    ok = final <= cfg["target"] and abs(final - final_ref) <= cfg["tolerance"] * final_ref
    if not ok:
        print(
            f"MISMATCH: final loss {final:.4f} (target {cfg['target']}), PyTorch {final_ref:.4f} "
            f"(tolerance {cfg['tolerance']:.0%})"
        )
        return 1
    sample = "".join(chars[int(i)] for i in x[0, :60].tolist())
    print(f"a held-out window: {sample!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
