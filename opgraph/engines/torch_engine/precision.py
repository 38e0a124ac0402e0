"""Exact math around torch's GEMM-class calls on CUDA. PyTorch lets cuDNN convolutions use TF32 by
default, may let cuBLAS use TF32 for fp32 GEMMs, and lets it reduce fp16/bf16 GEMMs in reduced
precision. The torch engine promises full fp32 (and fp32 accumulation for fp16/bf16), so a kernel
pins these flags for its duration and restores the caller's settings afterwards.

They are process-wide flags: a thread running torch GEMMs at the same moment sees them too (it only
gets more exact math). How each one is pinned, so that PyTorch's consistency checks between its
legacy and new (>= 2.9) TF32 APIs keep passing:
- cuDNN conv: the legacy `torch.backends.cudnn.allow_tf32 = False`, which sets >= 2.9's conv and rnn
  flags together to what its getter reads back (setting conv's flag alone, or to "ieee", makes that
  getter raise, and torch.export calls it); the caller's per-operator flags are restored one by one;
- cuBLAS fp32: `torch.set_float32_matmul_precision("highest")`, which sets the legacy and the new
  flags together; the caller's legacy value and new per-backend values are restored one by one;
- fp16/bf16 GEMMs: no reduced-precision reductions, no fp16 accumulation (split-K kept as it was).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

Undo = list[Callable[[], None]]


def _pin_attr(obj: Any, name: str, value: Any, undo: Undo) -> None:
    old = getattr(obj, name)
    setattr(obj, name, value)
    undo.append(lambda: setattr(obj, name, old))


def cudnn_flags(torch: Any) -> list[Any]:
    """PyTorch >= 2.9's per-operator cuDNN TF32 flags (conv and rnn), or [] before it."""
    flags = [getattr(torch.backends.cudnn, k, None) for k in ("conv", "rnn")]
    return [f for f in flags if f is not None and hasattr(f, "fp32_precision")]


def set_cudnn_tf32(torch: Any, allow: bool, undo: Undo) -> None:
    """cuDNN's TF32 set through the legacy setter, which writes conv's and rnn's flags together in
    the values its getter reads back ("tf32" / "none"); the caller's flags restored one by one. Setting
    conv's flag alone (or to "ieee") leaves a state in which the legacy getter, which torch.export
    calls, raises for the rest of the process."""
    saved = [(f, f.fp32_precision) for f in cudnn_flags(torch)]
    if saved:
        torch.backends.cudnn.allow_tf32 = allow

        values = {value for _, value in saved}

        def restore() -> None:
            if values in ({"tf32"}, {"none"}):  # what the legacy setter writes: through it again
                torch.backends.cudnn.allow_tf32 = values == {"tf32"}
                return
            for f, value in saved:
                f.fp32_precision = value

        undo.append(restore)
    else:
        _pin_attr(torch.backends.cudnn, "allow_tf32", allow, undo)


def _pin_conv(torch: Any, undo: Undo) -> None:
    set_cudnn_tf32(torch, False, undo)


def _pin_matmul(torch: Any, undo: Undo) -> None:
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:
        return  # the caller mixed PyTorch's legacy and new TF32 APIs inconsistently: leave them be
    per_backend = [
        m
        for m in (torch.backends.cuda.matmul, getattr(getattr(torch.backends, "mkldnn", None), "matmul", None))
        if m is not None and hasattr(m, "fp32_precision")
    ]
    saved = [(m, m.fp32_precision) for m in per_backend]
    torch.set_float32_matmul_precision("highest")

    def restore() -> None:
        torch.set_float32_matmul_precision(legacy)
        for m, value in saved:
            m.fp32_precision = value

    undo.append(restore)


def _pin_reductions(torch: Any, undo: Undo) -> None:
    mm = torch.backends.cuda.matmul
    for kind in ("fp16", "bf16"):
        name = f"allow_{kind}_reduced_precision_reduction"
        old: Any  # (flag, split-K flag), or the flag alone on a torch without the split-K one
        try:
            old = (getattr(mm, name), getattr(mm, f"{name}_split_k"))
        except AttributeError:  # torch without the split-K flag
            old = getattr(mm, name)
        split_k = old[1] if isinstance(old, tuple) else True
        setattr(mm, name, (False, split_k) if isinstance(old, tuple) else False)

        def restore(name: str = name, old: Any = old) -> None:
            setattr(mm, name, old)

        undo.append(restore)
    try:
        _pin_attr(mm, "allow_fp16_accumulation", False, undo)
    except (AttributeError, RuntimeError):
        pass


@contextmanager
def _pinned(*pins: Callable[[Any, Undo], None]) -> Iterator[None]:
    """The flags `pins` set for the duration, the caller's restored after (in reverse order)."""
    import torch

    undo: Undo = []
    try:
        for pin in pins:
            pin(torch, undo)
        yield
    finally:
        for fn in reversed(undo):
            fn()


def exact_gemm16() -> AbstractContextManager[None]:
    """fp32 accumulation pinned for an fp16/bf16 GEMM on CUDA (no reduced-precision reductions, no fp16
    accumulation), the caller's flags restored after: exact_math's part that such a GEMM reads, for the
    torch engine's direct matmul (the TF32 flags do not touch it; pinning them too costs its host time)."""
    return _pinned(_pin_reductions)


def exact_math(on_cuda: bool) -> AbstractContextManager[None]:
    """Pin exact fp32 / fp32-accumulating GEMMs on CUDA for the duration (nothing on the CPU)."""
    return _pinned(_pin_conv, _pin_matmul, _pin_reductions) if on_cuda else nullcontext()
