"""Small GPT-style decoders written with torch.nn, for the training tests: token embedding tied to the
output projection, learned or rotary positions, LayerNorm or RMSNorm, GELU or SwiGLU MLPs, and causal
attention written with explicit matmul / mask / softmax (what from_torch imports today) or
F.scaled_dot_product_attention (a custom op until the sdpa op lands)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, attention: str, rotary: bool) -> None:
        super().__init__()
        self.heads, self.attention, self.rotary = heads, attention, rotary
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)
        if rotary:
            hd = d // heads
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.register_buffer("cos", emb.cos(), persistent=False)
            self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        hd = c // self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in (q, k, v))
        if self.rotary:
            cos, sin = self.cos[:t].to(q.dtype), self.sin[:t].to(q.dtype)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate, self.up, self.down = (
            nn.Linear(d, hidden, bias=False),
            nn.Linear(d, hidden, bias=False),
            nn.Linear(hidden, d, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class GeluMLP(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, attention: str, rotary: bool, norm: str, mlp: str) -> None:
        super().__init__()
        Norm = nn.RMSNorm if norm == "rms" else nn.LayerNorm
        self.ln1, self.ln2 = Norm(d), Norm(d)
        self.attn = Attention(d, heads, seq, attention, rotary)
        self.mlp = SwiGLU(d, 4 * d) if mlp == "swiglu" else GeluMLP(d, 4 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """vocab, d, heads, seq, layers; attention 'explicit' | 'sdpa'; positions 'learned' | 'rotary';
    norm 'layer' | 'rms'; mlp 'gelu' | 'swiglu'; the head tied to the token embedding."""

    def __init__(
        self,
        vocab: int = 17,
        d: int = 16,
        heads: int = 2,
        seq: int = 8,
        layers: int = 2,
        *,
        attention: str = "explicit",
        positions: str = "learned",
        norm: str = "layer",
        mlp: str = "gelu",
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d) if positions == "learned" else None
        self.blocks = nn.ModuleList(
            Block(d, heads, seq, attention, positions == "rotary", norm, mlp) for _ in range(layers)
        )
        self.ln_f = nn.RMSNorm(d) if norm == "rms" else nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
