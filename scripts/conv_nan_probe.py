"""Fuzz seed 20261125508880 on a GPU: the generated conv_fprop kernel gave 0 where a NaN filter tap
makes the output NaN (H100, Triton 3.6). This runs the kernel through Triton's JIT with knob variants
(pipeline depth, BLOCK_K) on NaN and on finite filters, against PyTorch's conv1d in float64:

    python scripts/conv_nan_probe.py             # the case, knob variants, NaN and finite filters
    python scripts/conv_nan_probe.py --sweep     # ... and a sweep of tiles x BLOCK_K x stages x warps
    python scripts/conv_nan_probe.py --channels  # packed 1-D and 2-D convs of 1-8 channels (per group),
                                                 # every candidate config and the sweep: which are wrong
    python scripts/conv_nan_probe.py --variants  # the case's kernel with its source edited (which part
                                                 # goes wrong); Triton IR of each under $OUT/conv_ir
    python scripts/conv_nan_probe.py --shapes    # 1-D convs of 4 channels: out channels x width x
                                                 # weight layout x pipeline depth, plan knobs otherwise
    python scripts/conv_nan_probe.py --ptx [dump|fence|plain]  # the case's kernel (num_stages 1) run
                                                 # from its own PTX, edited (see ptx_probe)

The template wraps a ragged channel tail (channels per group % BLOCK_K != 0) by `%` in its loads and
zeroes it by selects (gemm/indexing.py TileIndexer: masked tails miscompiled on Triton 3.6 too).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from opgraph.core.device import resolve_device  # noqa: E402
from opgraph.core.piece import make_piece  # noqa: E402
from opgraph.core.tensor import storage_extent  # noqa: E402
from opgraph.engines.triton import TEMPLATE_BY_NAME  # noqa: E402
from opgraph.engines.triton.loader import load_module  # noqa: E402
from tests.fuzz.replay import load  # noqa: E402
from tests.fuzz.runner import graph_of  # noqa: E402

# the knobs the plan chose for the case
PLAN_KNOBS = dict(BLOCK_K=16, BLOCK_M=64, BLOCK_N=32, GROUP_M=8, SPLIT_K=1, num_stages=4, num_warps=4)
CASE = Path(__file__).resolve().parent.parent / "tests" / "fuzz" / "regressions" / "seed20261125508880.json"


def _buffer(desc, values, dev: str, shift: int = 0):
    """A NaN-filled buffer of desc's strides `shift` elements into its allocation, holding `values`."""
    raw = torch.full(
        (shift + storage_extent(desc.dim, desc.stride),), float("nan"), dtype=desc.data_type.to_torch(), device=dev
    )
    view = raw[shift:].as_strided(desc.dim, desc.stride)
    if values is not None:
        view.copy_(values.to(dev))
    return view


def main() -> None:
    final = graph_of(load(str(CASE))).final
    piece = make_piece(final, 0, final.nodes)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # (cpu: a dry run under TRITON_INTERPRET=1)
    device = resolve_device(dev)
    t = TEMPLATE_BY_NAME["conv_fprop"]
    base = PLAN_KNOBS
    x_uid, w_uid = final.inputs
    out_uid = final.outputs[0]
    xd, wd, od = (final.tensors[u] for u in (x_uid, w_uid, out_uid))
    gen = torch.Generator().manual_seed(0)

    for nan in (True, False):
        x = torch.randn(*xd.dim, generator=gen).to(torch.bfloat16)
        w = torch.randn(*wd.dim, generator=gen).to(torch.bfloat16)
        if nan:
            w[0, 1, 2] = float("nan")
        want = -torch.nn.functional.conv1d(x.double(), w.double())
        sweep = [
            {},
            {"num_stages": 1},
            {"num_stages": 2},
            {"num_stages": 3},
            {"BLOCK_K": 32},
            {"BLOCK_M": 16, "BLOCK_N": 16},
        ]
        if "--sweep" in sys.argv and not nan:
            sweep = [
                {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "num_stages": st, "num_warps": w}
                for m, n in ((64, 32), (64, 64), (128, 32), (32, 32), (16, 32))
                for k in (16, 32)
                for st in (1, 2, 3, 4)
                for w in (4, 8)
            ]
        for change in sweep:
            knobs = {**base, **change}
            g = t.generate(piece, knobs, device)
            mod = load_module(g.source, interpret=dev == "cpu")
            launch = g.launches[0]
            bufs = {x_uid: _buffer(xd, x, dev), w_uid: _buffer(wd, w, dev), out_uid: _buffer(od, None, dev)}
            args = [bufs[a.uid] for a in launch.args]
            meta = dict(launch.meta)
            getattr(mod, launch.kernel)[launch.grid](*args, **meta)
            if dev == "cuda":
                torch.cuda.synchronize()
            got = bufs[out_uid].double().cpu()
            ok = torch.allclose(got, want, rtol=1e-2, atol=1e-2, equal_nan=True)
            print(
                f"nan={nan} {change or 'plan knobs'}: {'OK' if ok else 'WRONG'} got {got.flatten().tolist()} "
                f"want {want.flatten().tolist()}"
            )
        # the same through a plan (the native launch of the precompiled kernel), buffers at an offset
        # of 0 and 1 elements (a 2-byte misaligned one takes Triton's JIT)
        plan = graph_of(load(str(CASE))).build(device=dev, engines=["triton"])
        for shift in (0, 1, 8):
            bufs = {
                x_uid: _buffer(xd, x, dev, shift),
                w_uid: _buffer(wd, w, dev, shift),
                out_uid: _buffer(od, None, dev, shift),
            }
            plan.execute(bufs)
            if dev == "cuda":
                torch.cuda.synchronize()
            got = bufs[out_uid].double().cpu()
            ok = torch.allclose(got, want, rtol=1e-2, atol=1e-2, equal_nan=True)
            print(
                f"nan={nan} plan.execute, buffers shifted {shift}: {'OK' if ok else 'WRONG'} "
                f"got {got.flatten().tolist()} ({plan.steps[0].config})"
            )


def channels() -> None:
    """Small channel counts (the ragged tail) in packed NCHW / NHWC convs, against PyTorch in float64:
    every candidate config of the template and a sweep; prints the wrong ones and a count."""
    import opgraph as og
    from opgraph.core.config import EngineConfig
    from opgraph.engines import get_engine
    from opgraph.tools.samples import nhwc

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = resolve_device(dev)
    t = TEMPLATE_BY_NAME["conv_fprop"]
    engine = get_engine("triton")
    sweep = [
        {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "SPLIT_K": 1, "num_stages": st, "num_warps": w}
        for m, n in ((64, 32), (128, 64), (16, 16))
        for k in (16, 32)
        for st in (1, 3, 4)
        for w in (4,)
    ]
    wrong = total = 0
    for c in (1, 3, 4, 8):
        for spatial in ((9,), (6, 7)):
            for layout in ("nchw", "nhwc"):
                n, k, r = 2, 8, 3
                xdims, wdims = [n, c, *spatial], [k, c, *(r,) * len(spatial)]
                g = og.Graph("probe", io_data_type=og.DataType.BFLOAT16, compute_data_type=og.DataType.FLOAT)
                x = g.tensor(dim=xdims, stride=nhwc(xdims) if layout == "nhwc" else None, name="x")
                w = g.tensor(dim=wdims, stride=nhwc(wdims) if layout == "nhwc" else None, name="w")
                y = g.conv_fprop(
                    x, w, padding=[1] * len(spatial), stride=[1] * len(spatial), dilation=[1] * len(spatial)
                )
                y.set_output(True).set_data_type(og.DataType.FLOAT)
                final = g.final
                piece = make_piece(final, 0, final.nodes)
                xd, wd, yd = (final.tensors[u] for u in (*final.inputs, final.outputs[0]))
                xv = torch.randn(*xdims).to(torch.bfloat16)
                wv = torch.randn(*wdims).to(torch.bfloat16)
                conv = torch.nn.functional.conv1d if len(spatial) == 1 else torch.nn.functional.conv2d
                want = conv(xv.double(), wv.double(), padding=1)
                for knobs in [*t.candidates(piece, device), *sweep]:
                    cfg = EngineConfig("triton", (("template", "conv_fprop"), *sorted(knobs.items())))
                    try:
                        kernel = engine.compile(piece, cfg, device)
                    except Exception as err:  # noqa: BLE001 - a config the template refuses here
                        print(f"C{c} {spatial} {layout} {knobs}: not compiled ({type(err).__name__})")
                        continue
                    bufs = {d.uid: _buffer(d, v, dev) for d, v in ((xd, xv), (wd, wv), (yd, None))}
                    kernel.run(bufs, None, torch.empty(max(kernel.scratch_bytes, 1), dtype=torch.uint8, device=dev))
                    got = bufs[yd.uid].double().cpu()
                    total += 1
                    if not torch.allclose(got, want, rtol=2e-2, atol=2e-2, equal_nan=True):
                        wrong += 1
                        print(
                            f"WRONG C{c} {spatial} {layout} {knobs}: max |err| "
                            f"{(got - want).abs().nan_to_num(float('inf')).max().item():.3g}"
                        )
    print(f"{wrong} wrong of {total} (config, shape) runs")


# edits of the generated kernel's text: (name, [(old, new), ...])
VARIANTS = [
    ("as generated", []),
    (
        "no selects (4x sums expected)",
        [("a = tl.where(kmask[None, :], a, 0)", "a = a"), ("b = tl.where(kmask[:, None], b, 0)", "b = b")],
    ),
    ("select a only", [("b = tl.where(kmask[:, None], b, 0)", "b = b")]),
    ("select b only", [("a = tl.where(kmask[None, :], a, 0)", "a = a")]),
    (
        "masked loads",
        [
            ("a = tl.where(kmask[None, :], a, 0)", "a = a"),
            ("b = tl.where(kmask[:, None], b, 0)", "b = b"),
            ("mask=amask[:, None]", "mask=amask[:, None] & kmask[None, :]"),
            ("mask=cmask[None, :]", "mask=cmask[None, :] & kmask[:, None]"),
        ],
    ),
    ("acc += dot", [("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b)")]),
    (
        "fp32 ieee dot",
        [("acc = tl.dot(a, b, acc)", 'acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")')],
    ),
    ("wrap without %", [("kcc = kc % 4", "kcc = kc - (kc // 4) * 4")]),
    (
        "where with zeros_like",
        [
            ("a = tl.where(kmask[None, :], a, 0)", "a = tl.where(kmask[None, :], a, tl.zeros_like(a))"),
            ("b = tl.where(kmask[:, None], b, 0)", "b = tl.where(kmask[:, None], b, tl.zeros_like(b))"),
        ],
    ),
]


def _case():
    """The case's piece, its x / w / out UIDs and descriptors, finite bf16 data and the answer (float64)."""
    from types import SimpleNamespace

    final = graph_of(load(str(CASE))).final
    x_uid, w_uid = final.inputs
    out_uid = final.outputs[0]
    xd, wd, od = (final.tensors[u] for u in (x_uid, w_uid, out_uid))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*xd.dim, generator=gen).to(torch.bfloat16)
    w = torch.randn(*wd.dim, generator=gen).to(torch.bfloat16)
    return SimpleNamespace(
        piece=make_piece(final, 0, final.nodes),
        uids=(x_uid, w_uid, out_uid),
        descs=(xd, wd, od),
        x=x,
        w=w,
        want=-torch.nn.functional.conv1d(x.double(), w.double()),
    )


def _run_generated(c, g, source: str, dev: str):
    """Launch generated kernel `g` (its text replaced by `source`) on the case's data: (output, compiled)."""
    mod = load_module(source, interpret=dev == "cpu")
    launch = g.launches[0]
    (x_uid, w_uid, out_uid), (xd, wd, od) = c.uids, c.descs
    bufs = {x_uid: _buffer(xd, c.x, dev), w_uid: _buffer(wd, c.w, dev), out_uid: _buffer(od, None, dev)}
    compiled = getattr(mod, launch.kernel)[launch.grid](*[bufs[a.uid] for a in launch.args], **dict(launch.meta))
    if dev == "cuda":
        torch.cuda.synchronize()
    return bufs[out_uid].double().cpu(), compiled


def variants() -> None:
    """The case's kernel (plan knobs and pipeline depths 1-4) with the edits of VARIANTS, finite data,
    against PyTorch in float64; the Triton IR (ttgir, ptx) of each compiled kernel under $OUT/conv_ir."""
    import os

    c = _case()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = resolve_device(dev)
    t = TEMPLATE_BY_NAME["conv_fprop"]
    ir = Path(os.environ.get("OUT", "/tmp")) / "conv_ir"
    ir.mkdir(parents=True, exist_ok=True)
    base = PLAN_KNOBS
    for stages in (4, 1, 2, 3):
        g = t.generate(c.piece, {**base, "num_stages": stages}, device)
        for name, edits in VARIANTS:
            source = g.source
            if any(old not in source for old, _ in edits):  # (the interpreter's kernel multiplies in fp32)
                print(f"num_stages={stages} {name}: n/a here")
                continue
            for old, new in edits:
                source = source.replace(old, new)
            got, compiled = _run_generated(c, g, source, dev)
            if dev == "cuda":
                tag = f"st{stages}-" + "".join(ch if ch.isalnum() else "_" for ch in name)
                for kind in ("ttgir", "ptx"):
                    (ir / f"{tag}.{kind}").write_text(str(compiled.asm.get(kind, "")))
            ok = torch.allclose(got, c.want, rtol=1e-2, atol=1e-2, equal_nan=True)
            print(
                f"num_stages={stages} {name}: {'OK' if ok else 'WRONG'} got {got.flatten().tolist()} "
                f"want {[round(v, 4) for v in c.want.flatten().tolist()]}"
            )


def _run_conv(xdims, xstride, wdims, wstride, knobs, dev, seed=0):
    """A 1-D bf16 conv (no padding) through the template with `knobs`: (ok, got, want)."""
    import opgraph as og
    from opgraph.core.config import EngineConfig
    from opgraph.engines import get_engine

    g = og.Graph("probe", io_data_type=og.DataType.BFLOAT16, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=xdims, stride=xstride, name="x")
    w = g.tensor(dim=wdims, stride=wstride, name="w")
    y = g.conv_fprop(x, w, padding=[0], stride=[1], dilation=[1])
    y.set_output(True).set_data_type(og.DataType.FLOAT)
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    xd, wd, yd = (final.tensors[u] for u in (*final.inputs, final.outputs[0]))
    gen = torch.Generator().manual_seed(seed)
    xv = torch.randn(*xdims, generator=gen).to(torch.bfloat16)
    wv = torch.randn(*wdims, generator=gen).to(torch.bfloat16)
    want = torch.nn.functional.conv1d(xv.double(), wv.double())
    cfg = EngineConfig("triton", (("template", "conv_fprop"), *sorted(knobs.items())))
    kernel = get_engine("triton").compile(piece, cfg, resolve_device(dev))
    bufs = {d.uid: _buffer(d, v, dev) for d, v in ((xd, xv), (wd, wv), (yd, None))}
    kernel.run(bufs, None, torch.empty(max(kernel.scratch_bytes, 1), dtype=torch.uint8, device=dev))
    got = bufs[yd.uid].double().cpu()
    return torch.allclose(got, want, rtol=2e-2, atol=2e-2, equal_nan=True), got, want


def shapes() -> None:
    """4-channel 1-D convs: output channels x width x weight layout x pipeline depth (64 x 32 x 16 tiles)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    c, r, n = 4, 3, 2
    wrong = total = 0
    for k in (2, 8):
        for width in (3, 34):
            xdims = [n, c, width]
            xstride = [c * width, 1, c]  # nwc
            wdims = [k, c, r]
            layouts = {"tap outermost (the case)": [c, 1, k * c], "nwc": [r * c, 1, c], "ncw": [c * r, r, 1]}
            for lname, wstride in layouts.items():
                for stages in (1, 3, 4):
                    knobs = {**PLAN_KNOBS, "num_stages": stages}
                    ok, got, want = _run_conv(xdims, xstride, wdims, wstride, knobs, dev)
                    total += 1
                    wrong += not ok
                    zeros = bool((got == 0).all())
                    print(
                        f"K{k} W{width} weights {lname} num_stages={stages}: {'OK' if ok else 'WRONG'}"
                        f"{' (all zeros)' if zeros and not ok else ''}"
                    )
    print(f"{wrong} wrong of {total}")


def ptx_probe(mode: str) -> None:
    """The case's kernel at num_stages 1 under Triton's IR dump/override (TRITON_KERNEL_DUMP /
    TRITON_KERNEL_OVERRIDE set by the caller): `dump` runs it and leaves its IR; `fence` and `plain`
    run it after the caller copied its PTX into the override directory, edited or not."""
    c = _case()
    knobs = {**PLAN_KNOBS, "num_stages": 1}
    g = TEMPLATE_BY_NAME["conv_fprop"].generate(c.piece, knobs, resolve_device("cuda"))
    got, _ = _run_generated(c, g, g.source, "cuda")
    ok = torch.allclose(got, c.want, rtol=1e-2, atol=1e-2, equal_nan=True)
    print(f"ptx {mode}: {'OK' if ok else 'WRONG'} got {got.flatten().tolist()}")


if __name__ == "__main__":
    if "--ptx" in sys.argv:
        ptx_probe(sys.argv[-1])
    elif "--shapes" in sys.argv:
        shapes()
    elif "--variants" in sys.argv:
        variants()
    elif "--channels" in sys.argv:
        channels()
    else:
        main()
