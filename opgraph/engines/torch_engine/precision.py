"""Exact math around torch's GEMM-class calls on CUDA: PyTorch lets cuDNN convolutions use TF32 by
default, and cuBLAS may reduce fp16/bf16 GEMMs in reduced precision. The torch engine promises
full fp32 (and fp32 accumulation for fp16/bf16), so it switches these off for the duration of a
kernel and restores the caller's settings afterwards. They are process-wide flags: a thread running
torch GEMMs at the same moment sees them too (harmless: it only gets more exact math).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def _settings(torch: Any) -> list[tuple[Any, str, Any]]:
    """(object, attribute, exact value) for every flag we pin."""
    cuda_mm = torch.backends.cuda.matmul
    out = []
    conv = getattr(torch.backends.cudnn, "conv", None)
    if hasattr(cuda_mm, "fp32_precision") and conv is not None and hasattr(conv, "fp32_precision"):
        out += [(cuda_mm, "fp32_precision", "ieee"), (conv, "fp32_precision", "ieee")]  # torch >= 2.9
    else:
        out += [(cuda_mm, "allow_tf32", False), (torch.backends.cudnn, "allow_tf32", False)]
    for name in ("allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction"):
        out.append((cuda_mm, name, False))
    return out


@contextmanager
def exact_math(on_cuda: bool) -> Iterator[None]:
    if not on_cuda:
        yield
        return
    import torch

    saved = []
    for obj, name, value in _settings(torch):
        try:
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)
        except (AttributeError, RuntimeError, ValueError):
            pass  # a flag this torch version does not have
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
