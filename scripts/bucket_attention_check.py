"""The serving Llama's attention (bf16, GQA 16/4, D 64, causal, heads read in place from [batch, seq, heads, 64])
at serving shapes: every forward config of the generated kernel's heuristic list for D <= 64 (and each with
TMA reads) beside cuDNN's plan, each output checked against PyTorch's SDPA in float32 first, then timed alone
(`ExecutionPlan.profile_steps`, median of 10). In a dynamic plan's bucket that cuDNN's padded form does not
take (opgraph/engines/cudnn_padded.py) attention runs the generated kernel: this says which config comes
closest to cuDNN (scripts/cudnn_padded_check.py measures the padded form itself).

    python scripts/bucket_attention_check.py                     # H200: 13x1569 and 5x1900
    python scripts/bucket_attention_check.py --shapes 8x1024     # other batch x seq
    python scripts/bucket_attention_check.py --dry               # CPU: the interpreter, a tiny shape (wiring only)
    python scripts/bucket_attention_check.py --shapes 3x20,2x300 --bucket 16x2048
                                        # short shapes, with cuDNN's padded plan of a 2-16 x 17-2048 bucket

On a GPU each shape also gets a row for cuDNN's padded form (opgraph/engines/cudnn_padded.py): the attention
of a dynamic graph over batch 1..B x seq 17..S (`--bucket BxS`, default 16x2048) built once with the cudnn
engine, its plan at the shape (one plan for the bucket, re-pointed).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--dry" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph.core.config import EngineConfig  # noqa: E402
from opgraph.engines.triton.attention.knobs import fwd_candidates  # noqa: E402
from tests.helpers import step_plan  # noqa: E402

HQ, HK, D = 16, 4, 64


def graph(b: int | og.Dim, s: int | og.Dim) -> tuple[og.Graph, og.Tensor]:
    g = og.Graph("attention", io_data_type=og.DataType.BFLOAT16, intermediate_data_type=og.DataType.FLOAT)

    def bshd(h: int) -> list:  # (the heads of a projection's output, read in place)
        return [s * h * D, D, h * D, 1]

    q = g.tensor(dim=[b, HQ, s, D], stride=bshd(HQ), name="q")
    k = g.tensor(dim=[b, HK, s, D], stride=bshd(HK), name="k")
    v = g.tensor(dim=[b, HK, s, D], stride=bshd(HK), name="v")
    o, _ = g.sdpa(q, k, v, attn_scale=1 / math.sqrt(D), generate_stats=False, use_causal_mask=True)
    o.set_output(True).set_stride(bshd(HQ))
    return g, o


def configs(base: EngineConfig, cuda: bool) -> list[EngineConfig]:
    """The heuristic's forward knobs for D 64, and each with TMA reads, as configs over `base`'s knobs."""
    found = []
    for knobs in fwd_candidates(D, cuda=cuda):
        for tma in (0, 1) if cuda else (0,):
            pairs = {f.name: getattr(knobs, f.name) for f in dataclasses.fields(knobs)}
            pairs["TMA"] = tma
            merged = {**dict(base.knobs), **{k: v for k, v in pairs.items() if v is not None}}
            config = EngineConfig("triton", tuple(sorted(merged.items())))
            if config not in found:
                found.append(config)
    return found


def as_float(value: object) -> torch.Tensor:
    """A pack's buffer (a torch tensor on the GPU, a NumPy array on the CPU) in float32."""
    if isinstance(value, torch.Tensor):
        return value.float()
    return torch.from_numpy(np.asarray(value, dtype=np.float32))


def poison(value: object) -> None:
    if isinstance(value, torch.Tensor):
        value.fill_(math.nan)
    else:
        value[...] = np.nan  # type: ignore[index]


def reference(pack: dict, g: og.Graph) -> torch.Tensor:
    """PyTorch's SDPA in float32 over the pack's q, k and v."""
    q, k, v = (as_float(pack[g.final.tensor(n).uid]) for n in "qkv")
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=1 / math.sqrt(D), enable_gqa=True
    )


def padded_row(plan: og.ExecutionPlan, dyn: og.Graph, b: int, s: int) -> tuple[float, float, str]:
    """(µs, error, config) of the bucket's padded cuDNN plan at one shape, on a pack of its own."""
    from opgraph.core.torch_interop import pack_to_device

    at = plan.at({"batch": b, "seq": s})
    static = dyn.final.at({"batch": b, "seq": s})
    pack = pack_to_device(og.testing.random_pack(static, np.random.default_rng(1)), "cuda")
    want = reference(pack, dyn)
    (o,) = static.outputs
    poison(pack[o])
    at.execute(pack)
    err = float((as_float(pack[o]) - want).abs().max()) / float(want.abs().max())
    (step,) = at.steps
    padded = getattr(step.kernel, "padded", None) is not None
    return at.profile_steps(pack, 10)[0].device_us, err, f"cudnn padded={padded} {dict(step.config.knobs)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="13x1569,5x1900", help="batch x seq, comma-separated")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--bucket", default="16x2048", help="the padded plan's bucket: batch 1..B x seq 17..S")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.dry
    device = "cuda" if cuda else "cpu"
    shapes = [(2, 33)] if args.dry else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    bucketed = None
    if cuda:
        top_b, top_s = (int(v) for v in args.bucket.split("x"))
        dyn, _ = graph(og.Dim("batch", 1, top_b), og.Dim("seq", 17, top_s))
        bucketed = (dyn.build(device=device, engines=["cudnn"], buckets="one"), dyn)
    for b, s in shapes:
        g, o = graph(b, s)
        pack = og.testing.random_pack(g.final, np.random.default_rng(0))
        if cuda:
            from opgraph.core.torch_interop import pack_to_device

            pack = pack_to_device(pack, device)
        want = reference(pack, g)
        scale = float(want.abs().max())
        rows = []
        triton = g.build(device=device, engines=["triton"])
        (step,) = triton.steps
        runs = [(c, triton, step) for c in configs(step.config, cuda)]
        if cuda:
            cudnn = g.build(device=device, engines=["cudnn"])
            runs.append((cudnn.steps[0].config, cudnn, cudnn.steps[0]))
        for config, plan, first in runs:
            try:
                one = step_plan(plan, first, config)
                poison(pack[o.known_uid()])
                one.execute(pack)
                err = float((as_float(pack[o.known_uid()]) - want).abs().max()) / scale
                us = one.profile_steps(pack, 10)[0].device_us if cuda else float("nan")
                rows.append((us, err, config))
            except Exception as e:  # noqa: BLE001 - a config that fails is a row, not the end of the run
                rows.append((float("inf"), float("nan"), f"{config}: {type(e).__name__}: {str(e)[:160]}"))
        if bucketed is not None:
            try:
                us, err, name = padded_row(*bucketed, b, s)
                rows.append((us, err, name))
            except Exception as e:  # noqa: BLE001
                rows.append((float("inf"), float("nan"), f"cudnn padded: {type(e).__name__}: {str(e)[:160]}"))
        print(f"== {b} x {s}: {len(rows)} configs (max |error| relative to max |output|; bf16 ~4e-3)")
        for us, err, config in sorted(rows, key=lambda r: r[0]):
            knobs = config if isinstance(config, str) else f"{config.engine} {dict(config.knobs)}"  # (or a row's text)
            print(f"{us:9.1f} us  err {err:.2e}  {'BAD ' if not err <= 2e-2 else ''}{knobs}", flush=True)


if __name__ == "__main__":
    main()
