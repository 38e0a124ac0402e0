"""The run's header (machine, software, settings) and the ceilings measured at its start."""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

from . import measure
from .core.floors import Ceilings

SETTINGS = (
    "torch.backends.cudnn.benchmark=True (eager picks cuDNN's fastest algorithm); TF32 off; "
    "L2 warm (calls back to back on the same buffers) unless --cold-l2"
)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except Exception:  # noqa: BLE001 - a missing tool leaves the field unknown
        return ""


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_digest() -> str:
    """A digest of the opgraph package's sources (Python and JSON; paths and contents): names the code
    that ran where the commit cannot (a copy whose git metadata is not the working tree's). The same
    digest of a checkout: `python -m bench.env`."""
    root = Path(__file__).resolve().parents[1] / "opgraph"
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json") and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def opgraph_commit() -> str:
    """The commit (OPGRAPH_COMMIT, else git's HEAD, "+dirty" where the tree differs from it) and the
    sources' digest."""
    digest = f"source {source_digest()}"
    if os.environ.get("OPGRAPH_COMMIT"):
        return f"{os.environ['OPGRAPH_COMMIT']} ({digest})"
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sha = _run(["git", "-C", here, "rev-parse", "--short", "HEAD"])
    if not sha:
        return f"unknown ({digest}; no git here: set OPGRAPH_COMMIT)"
    dirty = _run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"])
    return sha + ("+dirty" if dirty else "") + f" ({digest})"


def meta(device: str, *, dry_run: bool = False) -> dict[str, Any]:
    import torch

    m: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "opgraph_commit": opgraph_commit(),
        "settings": SETTINGS,
        "dry_run": dry_run,
    }
    if device.startswith("cuda"):
        m["device"] = torch.cuda.get_device_name()
        # the machine's GPUs (nvidia-smi ignores CUDA_VISIBLE_DEVICES, which a spread run's worker has set
        # to one GPU), else those this process sees
        listed = [line for line in _run(["nvidia-smi", "-L"]).splitlines() if line.startswith("GPU ")]
        m["gpu_count"] = len(listed) or torch.cuda.device_count()
        m["cudnn"] = torch.backends.cudnn.version()
        m["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[0:1]
        m["driver"] = m["driver"][0] if m["driver"] else "unknown"
    else:
        m.update(device="CPU (dry run: times are meaningless)", gpu_count=0, cudnn=None, driver="none")
    try:
        import triton

        m["triton"] = triton.__version__
    except ImportError:
        m["triton"] = None
    try:
        import torchvision

        m["torchvision"] = torchvision.__version__
    except Exception:  # noqa: BLE001 - absent or broken
        m["torchvision"] = None
    from .peers import cudnn_fe

    m["cudnn_frontend"] = cudnn_fe.version()
    return m


def _device_us(fn: Any, cuda: bool, budget: measure.Budget) -> float:
    est = measure.estimate_us(fn, cuda)
    return measure.device_us(fn, est, budget)[0] if cuda else measure.back_to_back_us(fn, est, budget, False)


def _copy_gbps(device: str, n: int, budget: measure.Budget) -> float:
    import torch

    a = torch.empty(n, dtype=torch.float16, device=device).normal_()
    b = torch.empty_like(a)
    us = _device_us(lambda: b.copy_(a), device.startswith("cuda"), budget)
    return 2 * a.numel() * a.element_size() / us / 1e3


def _read_gbps(device: str, n: int, budget: measure.Budget) -> float:
    import torch

    a = torch.empty(n, dtype=torch.float16, device=device).normal_()
    cuda = device.startswith("cuda")
    m = a.view(-1, 4096)  # also as a matrix-vector product (cuBLAS's GEMV streams a matrix): the faster
    v = torch.ones(4096, dtype=a.dtype, device=device)
    us = min(_device_us(lambda: a.sum(dtype=torch.float32), cuda, budget), _device_us(lambda: m @ v, cuda, budget))
    return a.numel() * a.element_size() / us / 1e3


def _gemm_tflops(device: str, m: int, dtype: Any, budget: measure.Budget) -> float:
    import torch

    x = torch.randn(m, m, device=device, dtype=dtype)
    y = torch.randn(m, m, device=device, dtype=dtype)
    return 2 * m**3 / _device_us(lambda: torch.mm(x, y), device.startswith("cuda"), budget) / 1e6


def _fp8_gemm_tflops(device: str, m: int, budget: measure.Budget) -> float | None:
    """cuBLASLt's E4M3 GEMM rate (torch._scaled_mm, per-tensor scales, bf16 out); None where the GPU or
    PyTorch has none."""
    import torch

    f8 = torch.float8_e4m3fn
    x = torch.randn(m, m, device=device).to(f8)
    y = torch.randn(m, m, device=device).to(f8).t()
    one = torch.ones((), device=device)
    call = lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    try:
        call()
    except (RuntimeError, NotImplementedError):
        return None
    return 2 * m**3 / _device_us(call, device.startswith("cuda"), budget) / 1e6


def ceilings(device: str, budget: measure.Budget) -> Ceilings:
    """Copy bandwidth (bytes read + written per second, 1 GiB moved per copy), read bandwidth (the
    faster of a sum over 512 MiB and a matrix-vector product reading it) and the cuBLAS GEMM rate at
    8192^3 for fp16 and bf16 (and E4M3 where the GPU has fp8 tensor cores), each as device time from the
    suite's CUDA-graph helper."""
    import torch

    cuda = device.startswith("cuda")
    n, m = (256 << 20, 8192) if cuda else (1 << 20, 256)
    rates = {
        "float16": _gemm_tflops(device, m, torch.float16, budget),
        "bfloat16": _gemm_tflops(device, m, torch.bfloat16, budget),
    }
    if cuda and torch.cuda.get_device_capability(device) >= (8, 9):
        fp8 = _fp8_gemm_tflops(device, m, budget)
        if fp8 is not None:
            rates["float8_e4m3fn"] = fp8
    return Ceilings(_copy_gbps(device, n, budget), rates, _read_gbps(device, n, budget))


if __name__ == "__main__":
    print(opgraph_commit())
