"""The generated flash-attention kernels (opgraph/engines/triton/attention), driven directly by their
spec on torch tensors, under Triton's interpreter on small shapes, against a float64 PyTorch math
reference written here (forward outputs, log-sum-exp, and autograd gradients for the backward):
masks (causal top-left / bottom-right, sliding window, padding), GQA, BSHD/BHSD layouts, bias with
broadcasts (and dBias), dropout (Philox, checked against an independent NumPy Philox; explicit
mask), score modifiers with their derivative, prologue/epilogue hooks, head dims with D != Dv and
non-powers of two, fp16/bf16, fully masked rows. Outputs are NaN-poisoned before every run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from ..helpers import requires_interpreter

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from opgraph.engines.triton.attention import (
    AttnSpec,
    BwdKnobs,
    Causal,
    Coords,
    FwdKnobs,
    MaskDropout,
    Operand,
    PhiloxDropout,
    Scalar,
    backward,
    forward,
)
from opgraph.engines.triton.attention.run import launch

pytestmark = [pytest.mark.interpreter, requires_interpreter]

TL = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
}
FWD = FwdKnobs(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
BWD = BwdKnobs(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, W1=4, S1=1, W2=4, S2=1, PRE_BLOCK=16)


# the tensors' uids: kernel parameters are named as in the engine (p{uid} a buffer, s{uid} a scalar)
UID = {
    n: i
    for i, n in enumerate(
        (
            "Q",
            "K",
            "V",
            "O",
            "LSE",
            "SQ",
            "SKV",
            "SCALE",
            "BIAS",
            "SEED",
            "OFFSET",
            "DMASK",
            "HS",
            "KS",
            "OS",
            "DO",
            "DQ",
            "DK",
            "DV",
            "DB",
        )
    )
}


def P(name: str) -> str:
    """The kernel parameter of buffer `name`."""
    return f"p{UID[name]}"


def operand(name: str, t) -> Operand:
    return Operand(P(name), TL[t.dtype], tuple(t.stride()))


def run(gen, args: dict) -> None:
    """The generated kernels on `args` (tensors and numbers by name), under the interpreter."""
    launch(gen, {UID[n]: v for n, v in args.items()}, interpret=True)


# -- the float64 reference ---------------------------------------------------------------------------


def philox_uniform(seed: int, counters: np.ndarray) -> np.ndarray:
    """Philox-4x32-10 (key = seed's low/high words, counter = (low, high, 0, 0) of each counter); the
    first output word read as int32, ~x where negative, times 4.6566127342e-10 in float32 (tl.rand):
    an implementation independent of Triton's and of the reference engine's."""
    m32 = np.uint64(0xFFFFFFFF)
    c = counters.astype(np.uint64)
    c0, c1 = c & m32, c >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & m32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & m32)
        k0 = (k0 + np.uint64(0x9E3779B9)) & m32
        k1 = (k1 + np.uint64(0xBB67AE85)) & m32
    x = c0.astype(np.uint32).view(np.int32)
    x = np.where(x < 0, ~x, x)
    return x.astype(np.float32) * np.float32(4.6566127342e-10)


def philox_keep(seed: int, offset: int, p: float, shape) -> torch.Tensor:
    counters = offset + np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    return torch.from_numpy(philox_uniform(seed, counters) >= np.float32(p))


def reference(
    q,
    k,
    v,
    scale,
    *,
    causal=Causal.NONE,
    window=None,
    seq_q=None,
    seq_kv=None,
    alibi=False,
    bias=None,
    keep=None,
    drop_scale=1.0,
    mod=None,
):
    """O and LSE of attention in float64 (the kernels' definition): scores scale * q k^T + bias +
    ALiBi, the score modifier, masked to -inf, softmax (a row with no key: P = 0, LSE +inf), dropout
    multiplier times its scale, P v; rows past seq_q give 0 and LSE +inf."""
    b, hq, sq, _ = q.shape
    skv = k.shape[2]
    k = k.repeat_interleave(hq // k.shape[1], 1)
    v = v.repeat_interleave(hq // v.shape[1], 1)
    s = (q @ k.transpose(-1, -2)) * scale
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    if bias is not None:
        s = s + bias
    if alibi:
        n = 2 ** int(math.log2(hq))
        slopes = [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)] + [
            2.0 ** (-4.0 * (2 * m + 1) / n) for m in range(hq - n)
        ]
        slope = torch.tensor(slopes, dtype=torch.float64)[None, :, None, None]
        s = s + slope * (j - i)
    if mod is not None:
        s = mod(s)
    ql = torch.full((b,), sq) if seq_q is None else seq_q.flatten().long()
    kl = torch.full((b,), skv) if seq_kv is None else seq_kv.flatten().long()
    ok = (j < kl[:, None, None, None]) & (i < ql[:, None, None, None])
    diag = (kl - ql)[:, None, None, None] if causal is Causal.BOTTOM_RIGHT else 0
    if causal is not Causal.NONE:
        ok = ok & (j <= i + diag)
    if window is not None:
        ok = ok & (i + diag - j < window)
    s = s.masked_fill(~ok, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse).nan_to_num(0.0)
    lse = lse.masked_fill(lse == -math.inf, math.inf)
    if keep is not None:
        p = p * keep * drop_scale
    o = p @ v
    row = i < ql[:, None, None, None]
    return o.masked_fill(~row, 0.0), lse.masked_fill(~row, math.inf)


# -- hooks ----------------------------------------------------------------------------------------------


class SoftCap:
    """score_mod: c * tanh(s / c)."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def params(self):
        return ()

    def forward(self, score, at):
        return [f"sc_t = _og_tanh({score} / {self.cap!r})"], f"{self.cap!r} * sc_t"

    def backward(self, score, grad, at):
        return [f"sc_t = _og_tanh({score} / {self.cap!r})"], f"{grad} * (1.0 - sc_t * sc_t)"

    def torch(self, s):
        return self.cap * torch.tanh(s / self.cap)


class RelPos:
    """score_mod: s * HS[h] + 0.25 * (j - i) + 0.5 * b, with HS a per-head tensor (a kernel parameter
    read through the coordinates)."""

    def __init__(self, hs) -> None:
        self.hs = hs

    def params(self):
        return (P("HS"),)

    def forward(self, score, at):
        return [
            f"hs = tl.load({P('HS')} + {at.h})"
        ], f"{score} * hs + 0.25 * ({at.j} - {at.i}).to(tl.float32) + 0.5 * {at.b}"

    def backward(self, score, grad, at):
        return [f"hs = tl.load({P('HS')} + {at.h})"], f"{grad} * hs"

    def torch(self, s):
        b, _h, sq, skv = s.shape
        i = torch.arange(sq)[:, None]
        j = torch.arange(skv)[None, :]
        return (
            s * self.hs.double()[None, :, None, None]
            + 0.25 * (j - i)
            + 0.5 * torch.arange(b, dtype=torch.float64)[:, None, None, None]
        )


class ScaleByVector:
    """Tile hook: x * T[feature] + c: a prologue making k from K (read here through the coordinates,
    `source` = (name, strides)) or an epilogue on O."""

    def __init__(self, name: str, t, c: float, source=None) -> None:
        self.name, self.t, self.c, self.source = name, t, c, source

    def params(self):
        return (self.name, self.source[0]) if self.source else (self.name,)

    def emit(self, value, at: Coords):
        m = f", mask={at.j} < {self.t.numel()}, other=0.0"
        lines = []
        if value is None:
            name, st = self.source
            mask = f", mask={at.mask}, other=0.0" if at.mask else ""
            lines.append(
                f"kp_src = tl.load({name} + {at.b} * {st[0]} + {at.h} * {st[1]} + {at.i} * {st[2]} + "
                f"{at.j}{mask}).to(tl.float32)"
            )
            value = "kp_src"
        return lines, f"{value} * tl.load({self.name} + {at.j}{m}) + {self.c!r}"

    def torch(self, x):
        return x * self.t.double() + self.c


# -- the runner -------------------------------------------------------------------------------------------


@dataclass
class Case:
    B: int = 1
    Hq: int = 2
    Hk: int = 2
    Sq: int = 40
    Skv: int = 37
    D: int = 16
    Dv: int | None = None
    dtype: str = "float32"
    layout: str = "bhsd"
    causal: Causal = Causal.NONE
    window: int | None = None
    seq_q: tuple[int, ...] | None = None
    seq_kv: tuple[int, ...] | None = None
    alibi: bool = False
    bias: tuple[int, int, int, int] | None = None
    dbias: bool = True
    dropout: str | None = None  # "philox", "philox_const" or "mask"
    mod: str | None = None  # "softcap" or "relpos"
    k_prologue: bool = False
    epilogue: bool = False
    scale: str = "number"  # or "arg", "ptr"
    fwd: FwdKnobs = FWD
    bwd: BwdKnobs | None = BWD
    extra: dict = field(default_factory=dict)


def _tensor(shape, dt, layout, gen):
    """Random [B, H, S, D] in layout bhsd or bshd (a permuted view of a [B, S, H, D] tensor)."""
    b, h, s, d = shape
    if layout == "bshd":
        return torch.randn(b, s, h, d, generator=gen).to(dt).permute(0, 2, 1, 3)
    return torch.randn(b, h, s, d, generator=gen).to(dt)


def run_case(c: Case, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, c.dtype)
    dv_ = c.Dv or c.D
    q = _tensor((c.B, c.Hq, c.Sq, c.D), dt, c.layout, gen)
    k = _tensor((c.B, c.Hk, c.Skv, c.D), dt, c.layout, gen)
    v = _tensor((c.B, c.Hk, c.Skv, dv_), dt, c.layout, gen)
    o = torch.full((c.B, c.Hq, c.Sq, dv_), float("nan"), dtype=dt)
    lse = torch.full((c.B, c.Hq, c.Sq, 1), float("nan"))
    args = {"Q": q, "K": k, "V": v, "O": o, "LSE": lse}
    kw = {}
    ref_kw = {}
    if c.seq_q is not None:
        args["SQ"] = torch.tensor(c.seq_q, dtype=torch.int32).view(c.B, 1, 1, 1)
        kw["seq_len_q"] = operand("SQ", args["SQ"])
        ref_kw["seq_q"] = args["SQ"]
    if c.seq_kv is not None:
        args["SKV"] = torch.tensor(c.seq_kv, dtype=torch.int32).view(c.B, 1, 1, 1)
        kw["seq_len_kv"] = operand("SKV", args["SKV"])
        ref_kw["seq_kv"] = args["SKV"]
    scale = 0.35
    if c.scale == "arg":
        args["SCALE"] = scale
        kw["scale"] = Scalar("arg", f"s{UID['SCALE']}")
    elif c.scale == "ptr":
        args["SCALE"] = torch.tensor([scale])
        kw["scale"] = Scalar("ptr", P("SCALE"))
    else:
        kw["scale"] = scale
    bias = None
    if c.bias is not None:
        bias = torch.randn(*c.bias, generator=gen)
        args["BIAS"] = bias
        kw["bias"] = operand("BIAS", bias.expand(c.B, c.Hq, c.Sq, c.Skv))
        kw["bias_dims"] = c.bias
    if c.dropout == "philox":
        p, sd, off = 0.3, 0x1234_5678_9ABC, 77
        args["SEED"], args["OFFSET"] = torch.tensor([sd]), torch.tensor([off])
        kw["dropout"] = PhiloxDropout(p, Scalar("ptr", P("SEED")), Scalar("ptr", P("OFFSET")))
        ref_kw["keep"] = philox_keep(sd, off, p, (c.B, c.Hq, c.Sq, c.Skv)).double()
        ref_kw["drop_scale"] = 1.0 / (1.0 - p)
    elif c.dropout == "philox_const":  # numbers baked in; counters crossing 2^32 (the high word)
        p, sd, off = 0.5, -99, 2**32 - 1500
        kw["dropout"] = PhiloxDropout(p, sd, off)
        ref_kw["keep"] = philox_keep(sd, off, p, (c.B, c.Hq, c.Sq, c.Skv)).double()
        ref_kw["drop_scale"] = 1.0 / (1.0 - p)
    elif c.dropout == "mask":
        m = (torch.rand(c.B, 1, c.Sq, c.Skv, generator=gen) > 0.25).to(torch.uint8)
        args["DMASK"] = m
        kw["dropout"] = MaskDropout(operand("DMASK", m.expand(c.B, c.Hq, c.Sq, c.Skv)), 1.25)
        ref_kw["keep"], ref_kw["drop_scale"] = m.double(), 1.25
    mod = None
    if c.mod == "softcap":
        mod = SoftCap(2.0)
    elif c.mod == "relpos":
        args["HS"] = torch.rand(c.Hq, generator=gen) + 0.5
        mod = RelPos(args["HS"])
    if mod is not None:
        kw["score_mod"] = mod
        ref_kw["mod"] = mod.torch
    kp = ep = None
    if c.k_prologue:
        args["KS"] = torch.rand(c.D, generator=gen) + 0.5
        kp = ScaleByVector(P("KS"), args["KS"], 0.125, source=(P("K"), tuple(k.stride())))
        kw["prologue"] = (("k", kp),)
    if c.epilogue:
        args["OS"] = torch.rand(dv_, generator=gen)
        ep = ScaleByVector(P("OS"), args["OS"], -1.0)
        kw["epilogue"] = ep
    spec = AttnSpec(
        c.B,
        c.Hq,
        c.Hk,
        c.Hk,
        c.Sq,
        c.Skv,
        c.D,
        dv_,
        operand("Q", q),
        operand("K", k),
        operand("V", v),
        operand("O", o),
        operand("LSE", lse),
        causal=c.causal,
        window=c.window,
        alibi=c.alibi,
        interpret=True,
        **kw,
    )
    run(forward(spec, c.fwd), args)

    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    bd = bias.double().requires_grad_() if bias is not None else None
    kin = kp.torch(kd) if kp else kd
    ro, rl = reference(qd, kin, vd, scale, causal=c.causal, window=c.window, alibi=c.alibi, bias=bd, **ref_kw)
    tol = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}[c.dtype]
    out_ref = ep.torch(ro) if ep else ro
    assert not o.isnan().any(), "O not fully written"
    assert torch.equal(torch.isinf(lse), torch.isinf(rl)), "rows with no key differ"
    _close(o.double(), out_ref, tol, "O")
    _close(lse.double().nan_to_num(0, 0, 0), rl.nan_to_num(0, 0, 0), max(tol, 1e-5), "LSE")
    if c.bwd is None or ep is not None or kp is not None:
        return
    do = torch.randn(o.shape, generator=gen).to(dt)
    grads = {
        "DQ": torch.full_like(q, float("nan")),
        "DK": torch.full_like(k, float("nan")),
        "DV": torch.full_like(v, float("nan")),
    }
    if bias is not None and c.dbias:
        grads["DB"] = torch.full_like(bias, float("nan"))
        kw["dbias"] = operand("DB", grads["DB"])
    bspec = AttnSpec(
        c.B,
        c.Hq,
        c.Hk,
        c.Hk,
        c.Sq,
        c.Skv,
        c.D,
        dv_,
        operand("Q", q),
        operand("K", k),
        operand("V", v),
        operand("O", o),
        operand("LSE", lse),
        causal=c.causal,
        window=c.window,
        alibi=c.alibi,
        do=operand("DO", do),
        dq=operand("DQ", grads["DQ"]),
        dk=operand("DK", grads["DK"]),
        dv=operand("DV", grads["DV"]),
        interpret=True,
        **kw,
    )
    run(backward(bspec, c.bwd), {**args, "DO": do, **grads})
    ro.backward(do.double())
    btol = {"float32": 5e-5, "float16": 1e-2, "bfloat16": 6e-2}[c.dtype]
    for name, ref in (("DQ", qd), ("DK", kd), ("DV", vd), ("DB", bd)):
        if name in grads:
            assert not grads[name].isnan().any(), f"{name} not fully written"
            _close(grads[name].double(), ref.grad, btol, name)


def _close(got, want, tol, what):
    scale = max(want.abs().max().item(), 0.1)  # a gradient that is 0 in exact math (row bias) is rounding
    err = (got - want).abs().max().item() / scale
    assert err <= tol, f"{what}: max error {err:.3g} of max |ref| {scale:.3g} (tolerance {tol})"


# -- tests ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", list(Causal))
@pytest.mark.parametrize("sq, skv", [(40, 37), (33, 48), (32, 32)])
def test_masks_and_lengths(causal, sq, skv):
    run_case(Case(Sq=sq, Skv=skv, causal=causal))


@pytest.mark.parametrize(
    "causal, window, sq, skv",
    [
        (Causal.TOP_LEFT, 7, 40, 37),
        (Causal.BOTTOM_RIGHT, 9, 30, 45),
        (Causal.NONE, 5, 40, 37),
        (Causal.BOTTOM_RIGHT, 1, 24, 40),
    ],
)
def test_sliding_window(causal, window, sq, skv):
    run_case(Case(Sq=sq, Skv=skv, causal=causal, window=window))


@pytest.mark.parametrize("causal, window", [(Causal.NONE, None), (Causal.BOTTOM_RIGHT, None), (Causal.TOP_LEFT, 6)])
def test_padding(causal, window):
    # batch 1 has a query length 0 (every row empty) and 0 keys in batch 2 (every row sees nothing)
    run_case(Case(B=3, causal=causal, window=window, seq_q=(35, 0, 20), seq_kv=(28, 37, 0)))


@pytest.mark.parametrize("hq, hk, layout", [(4, 2, "bhsd"), (4, 1, "bshd"), (2, 2, "bshd")])
def test_gqa_and_layouts(hq, hk, layout):
    run_case(Case(B=2, Hq=hq, Hk=hk, layout=layout, causal=Causal.TOP_LEFT))


@pytest.mark.parametrize("bias", [(2, 4, 40, 37), (1, 4, 40, 37), (2, 1, 1, 37), (1, 1, 40, 1)])
def test_bias_and_dbias(bias):
    run_case(Case(B=2, Hq=4, Hk=2, bias=bias, causal=Causal.BOTTOM_RIGHT if bias[0] == 1 else Causal.NONE))


def test_bias_minus_inf_rows_are_zero():
    """A bias that masks whole rows (-inf): those rows give O = 0 and LSE -inf, gradients finite."""
    c = Case(bias=(1, 2, 40, 37), dbias=False)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, s, 16, generator=gen) for s in (40, 37, 37))
    bias = torch.randn(1, 2, 40, 37, generator=gen)
    bias[:, :, 5] = -math.inf
    bias[:, 1, 9, :20] = -math.inf
    o = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 40, 1), float("nan"))
    spec = AttnSpec(
        1,
        2,
        2,
        2,
        40,
        37,
        16,
        16,
        operand("Q", q),
        operand("K", k),
        operand("V", v),
        operand("O", o),
        operand("LSE", lse),
        scale=0.5,
        bias=operand("BIAS", bias),
    )
    run(forward(spec, c.fwd), {"Q": q, "K": k, "V": v, "O": o, "LSE": lse, "BIAS": bias})
    ro, _rl = reference(q.double(), k.double(), v.double(), 0.5, bias=bias.double())
    assert (o[:, :, 5] == 0).all() and (lse[:, :, 5] == math.inf).all()
    _close(o.double(), ro, 2e-5, "O")
    do = torch.randn_like(o)
    g = {n: torch.full_like(t, float("nan")) for n, t in (("DQ", q), ("DK", k), ("DV", v))}
    bspec = AttnSpec(
        1,
        2,
        2,
        2,
        40,
        37,
        16,
        16,
        operand("Q", q),
        operand("K", k),
        operand("V", v),
        operand("O", o),
        operand("LSE", lse),
        scale=0.5,
        bias=operand("BIAS", bias),
        do=operand("DO", do),
        dq=operand("DQ", g["DQ"]),
        dk=operand("DK", g["DK"]),
        dv=operand("DV", g["DV"]),
    )
    run(backward(bspec, c.bwd), {"Q": q, "K": k, "V": v, "O": o, "LSE": lse, "BIAS": bias, "DO": do, **g})
    assert all(t.isfinite().all() for t in g.values())
    assert (g["DQ"][:, :, 5] == 0).all()


@pytest.mark.parametrize("hq", [4, 6])
def test_alibi(hq):
    run_case(Case(Hq=hq, Hk=hq // 2, alibi=True, causal=Causal.TOP_LEFT if hq == 4 else Causal.NONE))


def test_philox_matches_reference_engine():
    """The kernel's draw (through the keep mask it implies) and the reference engine's
    attention_ref.dropout_keep are one definition: the independent NumPy Philox here equals it."""
    from opgraph.ops import attention_ref

    shape = (2, 3, 5, 7)
    for seed, offset, p in ((0x1234_5678_9ABC, 77, 0.3), (-5, 2**33 - 20, 0.9), (7, 0, 0.0)):
        mine = philox_keep(seed, offset, p, shape).numpy()
        assert np.array_equal(mine, attention_ref.dropout_keep(p, seed, offset, shape))


@pytest.mark.parametrize("kind", ["philox", "philox_const", "mask"])
def test_dropout(kind):
    run_case(Case(B=2, Hq=2, Hk=1, dropout=kind, causal=Causal.TOP_LEFT if kind == "mask" else Causal.NONE))


@pytest.mark.parametrize(
    "mod, causal", [("softcap", Causal.TOP_LEFT), ("relpos", Causal.NONE), ("softcap", Causal.BOTTOM_RIGHT)]
)
def test_score_mod(mod, causal):
    run_case(Case(B=2, Hq=2, Hk=1, mod=mod, causal=causal, seq_kv=(30, 37) if mod == "relpos" else None))


@pytest.mark.parametrize("d, dv", [(24, 40), (32, 16), (64, 64)])
def test_head_dims(d, dv):
    run_case(Case(Sq=24, Skv=21, D=d, Dv=dv, causal=Causal.TOP_LEFT))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types(dtype):
    run_case(Case(B=2, dtype=dtype, causal=Causal.BOTTOM_RIGHT, bias=(2, 2, 40, 37)))


@pytest.mark.parametrize("scale", ["arg", "ptr"])
def test_runtime_scale(scale):
    run_case(Case(scale=scale, causal=Causal.TOP_LEFT))


def test_prologue_and_epilogue_hooks():
    run_case(Case(k_prologue=True, epilogue=True, causal=Causal.TOP_LEFT, D=16, Dv=24), seed=5)


@pytest.mark.parametrize(
    "fwd, bwd",
    [
        (FwdKnobs(32, 16, 4, 1), BwdKnobs(32, 16, 16, 32, 4, 1, 4, 1, 32)),
        (FwdKnobs(16, 32, 4, 1), BwdKnobs(16, 16, 16, 16, 4, 1, 4, 1, 16)),
        (FwdKnobs(16, 16, 4, 1, ORDER=1), BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16, FUSED=1)),
        (FwdKnobs(16, 32, 4, 1, ONELOOP=1), BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16, ONELOOP=1)),
        (FwdKnobs(32, 16, 4, 1, ONELOOP=1), BwdKnobs(32, 16, 16, 32, 4, 1, 4, 1, 16, FUSED=1, ONELOOP=1)),
    ],
)
def test_block_shapes(fwd, bwd):
    """Block shapes with BLOCK_M > BLOCK_N and the reverse, so the diagonal and window edges fall
    inside and across tiles."""
    run_case(Case(B=2, Sq=45, Skv=50, causal=Causal.BOTTOM_RIGHT, window=13, seq_kv=(44, 50), fwd=fwd, bwd=bwd))


@pytest.mark.parametrize("causal, hk", [(Causal.TOP_LEFT, 1), (Causal.NONE, 2)])
def test_fused_backward(causal, hk):
    """FUSED=1: the dK/dV and dQ programs in one launch (GQA groups, causal heavy-first order)."""
    run_case(
        Case(
            B=2,
            Hq=4,
            Hk=hk,
            Sq=45,
            Skv=50,
            causal=causal,
            bias=(2, 4, 45, 50),
            bwd=BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16, FUSED=1),
        )
    )


@pytest.mark.parametrize("layout, d", [("bhsd", 16), ("bshd", 24)])
def test_tensor_descriptors(layout, d):
    """TMA=1: q/k/v (forward), q/dO (dK/dV) and k/v (dQ) read through tensor descriptors, whose
    zero-filled edges replace the masks (ragged lengths, a head dim that is no power of two)."""
    run_case(
        Case(
            B=2,
            Hq=4,
            Hk=2,
            Sq=45,
            Skv=50,
            D=d,
            Dv=d,
            layout=layout,
            causal=Causal.BOTTOM_RIGHT,
            fwd=FwdKnobs(16, 16, 4, 1, TMA=1),
            bwd=BwdKnobs(16, 32, 32, 16, 4, 1, 4, 1, 16, TMA=1),
        )
    )
