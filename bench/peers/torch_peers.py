"""PyTorch peers: eager calls and torch.compile.

torch.compile rows: "torch.compile" is mode="max-autotune-no-cudagraphs": its execute rows are plain
calls, its CUDA-graph rows the same compiled code captured by the suite's helper; "torch.compile (CUDA
graphs)" is mode="max-autotune", whose calls replay Inductor's own CUDA graphs (CUDA-graph tables
only). fullgraph=True where a graph break would silently leave work to eager; dynamic=False;
`freezing` (inference) folds the module's weights as constants. Compile time is setup_s.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from ..case import Impl, Runner

EAGER_ENGINE = "ATen (cuDNN/cuBLAS + native kernels)"
INDUCTOR_ENGINE = "Inductor (generated Triton + ATen/cuBLAS/cuDNN externs)"
OPGRAPH_BACKEND_ENGINE = "opgraph plans (torch.compile backend; PyTorch runs what they do not)"


def eager(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    name: str = "torch eager",
    engine: str = EAGER_ENGINE,
    grad: bool = False,
    needs: Sequence[str] = (),
) -> Impl:
    """fn(*args) as PyTorch runs it, op by op."""

    def setup() -> Runner:
        def call() -> Any:
            if grad:
                return fn(*args)
            with __import__("torch").no_grad():
                return fn(*args)

        return Runner(call=call, engine=engine)

    return Impl(name, setup, role="peer", needs=frozenset(needs))


def compiled(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    inference: bool = True,
    freezing: bool = False,
    fullgraph: bool = True,
    cudagraphs: bool = True,
    read: Callable[[Any], Sequence[Any]] | None = None,
    reset: Callable[[], None] | None = None,
    prepare: Callable[[Callable], Callable] | None = None,
    default: bool = False,
) -> list[Impl]:
    """The torch.compile peers of fn(*args): mode max-autotune-no-cudagraphs (execute and captured
    rows), when `default` the default mode too (what most users run) and, when `cudagraphs`,
    max-autotune (its own CUDA graphs). `prepare(compiled_fn)` may wrap the compiled callable into the
    thing called (a training step)."""
    modes = [("torch.compile", "max-autotune-no-cudagraphs", False)]
    if default:
        modes.append(("torch.compile (default mode)", "default", False))
    if cudagraphs:
        modes.append(("torch.compile (CUDA graphs)", "max-autotune", True))
    out = []
    for name, mode, native in modes:
        out.append(
            Impl(
                name,
                _compile_setup(fn, args, mode, native, inference, freezing, fullgraph, read, reset, prepare),
                role="peer",
                needs=frozenset({"compile", "cuda"} if native else {"compile"}),
            )
        )
    return out


def opgraph_backend(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    inference: bool = True,
    cudagraphs: bool = True,
) -> list[Impl]:
    """opgraph reached through `torch.compile(fn, backend="opgraph")` (issue 43): its plain calls and, when
    `cudagraphs`, mode="reduce-overhead" (PyTorch's CUDA graph trees replaying the plans)."""
    modes = [("opgraph (torch.compile backend)", None, False)]
    if cudagraphs:
        modes.append(("opgraph (torch.compile backend, CUDA graphs)", "reduce-overhead", True))
    out = []
    for name, mode, native in modes:
        setup = _registered(
            _compile_setup(fn, args, mode, native, inference, False, True, None, None, None, backend="opgraph")
        )
        out.append(Impl(name, setup, role="ours", needs=frozenset({"compile", "cuda"} if native else {"compile"})))
    return out


def register_opgraph_backend() -> None:
    """Make backend="opgraph" known to Dynamo: the name comes from the installed package's entry point; a
    checkout on PYTHONPATH (the GPU machine's) has none, so it is registered here."""
    from torch._dynamo import list_backends, register_backend

    if "opgraph" not in list_backends(exclude_tags=()):
        import opgraph

        register_backend(name="opgraph")(opgraph.torch_backend)


def _registered(setup: Callable[[], Runner]) -> Callable[[], Runner]:
    """`setup` with backend="opgraph" known to Dynamo (register_opgraph_backend)."""

    def wrapped() -> Runner:
        register_opgraph_backend()
        return setup()

    return wrapped


def _cudagraph_skips() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(sum(counters["inductor"].get(k, 0) for k in counters["inductor"] if "cudagraph_skip" in k))
    except Exception:  # noqa: BLE001 - counters are internal; no note then
        return 0


def _compile_setup(
    fn: Callable[..., Any],
    args: Sequence[Any],
    mode: str,
    native: bool,
    inference: bool,
    freezing: bool,
    fullgraph: bool,
    read: Any,
    reset: Any,
    prepare: Any,
    backend: str = "inductor",
) -> Callable[[], Runner]:
    def setup() -> Runner:
        import torch

        # a fresh Dynamo: the other mode's compiled code and its CUDA-graph pools must not serve this one
        torch._dynamo.reset()
        # The inputs never move (as in every captured graph here): no copy into static buffers per call. Not
        # with freezing: it folds tensors marked static like parameters, so a whole network of constant
        # inputs became a constant output (no kernel ran: 45 µs "replays" of ResNet-50 on 2026-11-26).
        if native and not freezing:
            for a in args:
                if isinstance(a, torch.Tensor):
                    torch._dynamo.mark_static_address(a)
        f = torch.compile(fn, backend=backend, mode=mode, fullgraph=fullgraph, dynamic=False)
        step = prepare(f) if prepare is not None else (lambda: f(*args))
        grad_ctx = torch.no_grad if inference else contextlib.nullcontext
        patch = torch._inductor.config.patch(freezing=freezing) if freezing else contextlib.nullcontext()

        def call() -> Any:
            with grad_ctx():
                return step()

        skips_before = _cudagraph_skips()
        with patch:
            for _ in range(3):  # compile, then (max-autotune) record Inductor's CUDA graphs
                call()
        torch.cuda.synchronize()
        notes = (
            (f"backend={backend}, " if backend != "inductor" else "")
            + f"mode={mode}"
            + (", freezing" if freezing else "")
        )
        if native and _cudagraph_skips() > skips_before:  # the row would claim CUDA graphs it does not use
            notes += "; Inductor skipped CUDA graphs for part of it (see the log)"
        return Runner(
            call=call,
            engine=INDUCTOR_ENGINE if backend == "inductor" else OPGRAPH_BACKEND_ENGINE,
            notes=notes,
            graph_native=native,
            read=read,
            reset=reset,
            capturable=not native,
            keep=f,
        )

    return setup
