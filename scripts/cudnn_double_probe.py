"""What cuDNN does with a DOUBLE result, asked directly (the cudnn engine's own rule bypassed): the GPU
fuzzer's seed20261125502833 (an fp16 matmul, fp32 compute, DOUBLE output) got NaN on an H100 through the
cudnn engine. One short run on a GPU with nvidia-cudnn-frontend:

    python scripts/cudnn_double_probe.py

Per case: whether cuDNN's support check accepts it, the plan's name, and the result (poisoned with NaN
first) against float64 torch. Expected: the DOUBLE cases accepted with NaN (or wrong) results, the
FLOAT control exact to fp32; and `engine rule:` naming DOUBLE for the first three (this branch's fix).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import opgraph as og  # noqa: E402
from opgraph import DataType as DT  # noqa: E402
from opgraph.core.config import EngineConfig  # noqa: E402
from opgraph.core.device import resolve_device  # noqa: E402
from opgraph.core.piece import make_piece  # noqa: E402
from opgraph.engines import cudnn_frontend as cf  # noqa: E402


def matmul(out: DT, compute: DT = DT.FLOAT, epilogue: bool = False) -> og.Graph:
    g = og.Graph("probe", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    a = g.tensor(dim=[1, 3, 4], name="A")
    b = g.tensor(dim=[1, 4, 7], name="B")
    c = g.matmul(a, b, name="mm", compute_data_type=compute)
    (g.relu(c, name="act") if epilogue else c).set_data_type(out).set_output(True)
    return g


def conv(out: DT) -> og.Graph:
    g = og.Graph("probe", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 8, 6, 6], stride=[288, 1, 48, 8], name="x")
    w = g.tensor(dim=[16, 8, 3, 3], stride=[72, 1, 24, 8], name="w")
    g.conv_fprop(x, w, padding=[1, 1], name="conv").set_data_type(out).set_output(True)
    return g


def probe(label: str, g: og.Graph, dev) -> None:
    g.validate()
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    rule = cf.static_problem(piece)
    print(f"== {label}\n   engine rule: {rule[0] if rule else 'offered'}")
    try:
        _, names = cf._plans(piece, dev, "A")
    except Exception as err:  # noqa: BLE001 - cuDNN's refusal is an answer here
        print(f"   cuDNN declines: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return
    print(f"   cuDNN accepts: {len(names)} plan(s), first {names[0]}")
    kernel = cf.CudnnKernel(piece, EngineConfig("cudnn", (("heuristic", "A"), ("plan", 0), ("name", names[0]))), dev)
    gen = torch.Generator().manual_seed(0)
    bufs = {}
    for uid in final.inputs:
        t = final.tensors[uid]
        host = (torch.rand(t.dim, generator=gen, dtype=torch.float64) * 4 - 2).to(t.data_type.to_torch())
        bufs[uid] = torch.empty_strided(t.dim, t.stride, dtype=host.dtype, device="cuda").copy_(host)
    (out_uid,) = final.outputs
    o = final.tensors[out_uid]
    bufs[out_uid] = torch.full(o.dim, float("nan"), dtype=o.data_type.to_torch(), device="cuda")
    scratch = torch.empty(max(kernel.scratch_bytes, 1), dtype=torch.uint8, device="cuda")
    kernel.run(bufs, None, scratch)
    torch.cuda.synchronize()
    x, y = (bufs[u].double() for u in final.inputs)
    if final.nodes[0].kind == "matmul":
        want = x @ y
    else:
        want = torch.nn.functional.conv2d(x, y, padding=1)
    if len(final.nodes) > 1:
        want = want.relu()
    got = bufs[out_uid].double()
    print(
        f"   NaN in result: {int(got.isnan().sum())} of {got.numel()}; max |err| "
        f"{float((got - want).abs().nan_to_num(float('inf')).max()):.3g}; got[0] {got.flatten()[:3].tolist()} "
        f"want {want.flatten()[:3].tolist()}"
    )


def main() -> None:
    dev = resolve_device("cuda")
    problem = cf._import_problem()
    if problem:
        sys.exit(problem)
    print(f"{dev}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    probe("fp16 matmul -> DOUBLE (the fuzz case)", matmul(DT.DOUBLE), dev)
    probe("fp16 matmul -> relu -> DOUBLE", matmul(DT.DOUBLE, epilogue=True), dev)
    probe("fp16 conv_fprop -> DOUBLE", conv(DT.DOUBLE), dev)
    probe("fp16 matmul -> FLOAT (control)", matmul(DT.FLOAT), dev)


if __name__ == "__main__":
    main()
