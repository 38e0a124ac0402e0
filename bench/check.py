"""Correctness before timing: poison every output, run, compare each with its float64 reference.

Outputs an implementation writes in place are NaN-filled before each check. Outputs it allocates
itself cannot be filled before they exist; for those the caching allocator is poisoned instead: blocks
of each output's size are allocated, NaN-filled and freed just before the call, so that a kernel that
skipped part of its output would hand back NaN rather than a stale correct result.
"""

from __future__ import annotations

from typing import Any, Sequence

from .case import Output, Runner


ZERO_RMS = 1e-12  # a float64 reference with a smaller root-mean-square is zero to its own rounding


def _zero(norm: float, numel: int) -> bool:
    return numel > 0 and norm / numel**0.5 <= ZERO_RMS


def zero_reference(want: Any) -> bool:
    """The output is zero in exact arithmetic (its float64 reference is rounding noise, e.g. the gradient
    of a batchnorm bias whose output a later training-mode batchnorm re-centres): a relative error would
    divide by noise, so such an output is compared in absolute terms (`relerr`)."""
    return _zero(float(want.norm()), want.numel())


def relerr(got: Any, want: Any) -> float:
    """||got - want|| / ||want|| in float64 (NaN if got holds a NaN or an inf); for a reference that is
    zero to float64 rounding (`zero_reference`), the root-mean-square of got - want instead."""
    import torch

    if not isinstance(got, torch.Tensor):
        got = torch.as_tensor(got)
    g = got.detach().to(device=want.device, dtype=torch.float64)
    if g.numel() != want.numel():
        raise ValueError(
            f"output has {g.numel()} elements, its reference {want.numel()} "
            f"(shapes {list(got.shape)} and {list(want.shape)})"
        )
    g = g.reshape(want.shape)
    if not torch.isfinite(g).all():
        return float("nan")
    diff, norm = float((g - want).norm()), float(want.norm())
    return diff / want.numel() ** 0.5 if _zero(norm, want.numel()) else diff / max(norm, 1e-300)


def nan_fill(tensors: Sequence[Any]) -> None:
    for t in tensors:
        if t.is_floating_point():
            t.fill_(float("nan"))
        else:
            t.fill_(-7)


def poison_allocator(refs: Sequence[Any], outputs: Sequence[Output], device: str, copies: int = 3) -> None:
    import torch

    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
    blocks = []
    for ref, out in zip(refs, outputs):
        for _ in range(copies):
            blocks.append(
                torch.full(tuple(ref.shape), float("nan"), dtype=dtypes.get(out.dtype, torch.float32), device=device)
            )
    del blocks


def as_list(ret: Any) -> list[Any]:
    if ret is None:
        return []
    if isinstance(ret, (list, tuple)):
        return list(ret)
    return [ret]


def read_outputs(runner: Runner, ret: Any) -> list[Any]:
    if runner.read is not None:
        return list(runner.read(ret))
    if runner.outputs is not None:
        return list(runner.outputs)
    return as_list(ret)


def compare(got: Sequence[Any], refs: Sequence[Any], outputs: Sequence[Output]) -> dict[str, float | None]:
    errs: dict[str, float | None] = {}
    for i, out in enumerate(outputs):
        errs[out.name] = relerr(got[i], refs[i]) if i < len(got) and got[i] is not None else None
    return errs


def check_execute(
    runner: Runner, refs: Sequence[Any], outputs: Sequence[Output], device: str
) -> dict[str, float | None]:
    """Errors of one plain call (or the runner's check_call), its outputs poisoned first."""
    import torch

    if runner.reset is not None:
        runner.reset()
    if runner.outputs is not None:
        nan_fill(runner.outputs)
    else:
        poison_allocator(refs, outputs, device)
    ret = (runner.check_call or runner.call)()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return compare(read_outputs(runner, ret), refs, outputs)


def check_graph(
    runner: Runner, captured_ret: Any, replay: Any, refs: Sequence[Any], outputs: Sequence[Output]
) -> dict[str, float | None]:
    """Errors of one replay of a captured call: the graph's own output buffers poisoned first."""
    import torch

    if runner.reset is not None:
        runner.reset()
    # the graph's own output buffers: what it returned when captured (or the runner's static outputs);
    # state a `read` also reports (parameters, statistics) is restored by `reset` instead
    nan_fill(
        [
            t
            for t in (as_list(captured_ret) if runner.read is not None else read_outputs(runner, captured_ret))
            if hasattr(t, "is_floating_point")
        ]
    )
    replay()
    torch.cuda.synchronize()
    return compare(read_outputs(runner, captured_ret), refs, outputs)
