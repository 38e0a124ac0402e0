"""The workload interface: what a registered `make(ctx)` returns (a `Case`), and the context it gets.

A Case names its outputs (each checked for every implementation), gives their float64 reference,
the implementations (ours and the peers) and the floor. An implementation (`Impl`) is set up lazily,
one at a time, by its `setup()`, which returns a `Runner`: the call to time and where its outputs are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .core.floors import Floor

TORCH_DTYPE_NAMES = {"float16", "bfloat16", "float32", "float64"}


@dataclass(frozen=True)
class Output:
    name: str
    dtype: str  # the implementation's output type: float16, bfloat16, float32 (sets the unit-roundoff floor)


@dataclass
class Runner:
    """A set-up implementation.

    call        one run, the thing timed. It may return its outputs (fresh tensors, in the Case's output
                order; one tensor or a sequence) or write them into `outputs`.
    outputs     static output buffers in the Case's order (NaN-filled before each check), or None.
    read        maps what `call` returned (or None) to the tensors compared with the reference, when
                neither of the above fits (a training step's gradients and updated parameters).
    reset       restores state before a check (a training step's parameters, velocities, statistics).
    check_call  what the check runs instead of `call` (e.g. both packs of a double-buffered plan).
    capturable  False: never captured by the suite's CUDA-graph helper (device time from the profiler).
    graph_native: its calls replay its own CUDA graphs (torch.compile mode="max-autotune"): its plain
                calls are CUDA-graph-mode numbers.
    host_only   a host-time row (tiny shapes): host_us, execute_us and latency_us.
    """

    call: Callable[[], Any]
    outputs: Sequence[Any] | None = None
    read: Callable[[Any], Sequence[Any]] | None = None
    reset: Callable[[], None] | None = None
    check_call: Callable[[], Any] | None = None
    engine: str = ""
    notes: str = ""
    capturable: bool = True
    graph_native: bool = False
    host_only: bool = False
    keep: Any = None  # objects the call needs alive (plans, graphs, modules)
    measured: dict[str, float] | None = None  # metrics the setup measured itself (fresh-process timings)
    errors: dict[str, float | None] | None = None  # with `measured`: the errors it found (no check here)
    after: Callable[[], str] | None = None  # a note made once every check and time is taken (a step profile)


@dataclass
class Impl:
    name: str
    setup: Callable[[], Runner]
    role: str = "peer"  # "ours" or "peer"
    tuned: bool | None = None
    needs: frozenset[str] = frozenset()  # features the machine must have: cuda, compile, cudnn_frontend, torchvision


@dataclass
class Case:
    outputs: list[Output]
    reference: Callable[[], Sequence[Any]]  # float64 results, in output order
    impls: list[Impl]
    floor: Floor = field(default_factory=Floor)
    notes: str = ""
    host_only: bool = False  # host-time rows (tiny shapes): every implementation gets host_us, execute_us, latency_us
    sane_limit: float = 0.5  # above this relative error an output is garbage and its implementation is not timed


SCALES = ("full", "quick", "tiny")


@dataclass
class Ctx:
    """What a workload's `make` may use: the device and the scale of shapes, the run's options and
    helpers for tensors."""

    device: str = "cuda"
    scale: str = "full"  # full (the real shapes), quick (smaller, for smoke tests on a GPU), tiny (CPU dry run)
    tune: bool = True  # build tuned plans (opgraph and generated) and tune cuDNN over all plans
    tune_networks: bool = False  # tuned plans for whole networks (minutes of tuning the first time)
    compile: bool = True
    compile_cudagraphs: bool = True  # the torch.compile mode="max-autotune" row (its own CUDA graphs)
    cold_l2: bool = False
    features: frozenset[str] = frozenset()
    deadline: float | None = None  # time.monotonic() after which no new implementation starts
    timing: bool = True  # False (--warm): set up and check only
    seed: int = 0
    workload: str = ""  # the id of the workload being made (set by the runner)

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def pick(self, full: Any, quick: Any = None, tiny: Any = None) -> Any:
        """The value for this scale (quick falls back to full, tiny to quick)."""
        if self.scale == "tiny":
            return tiny if tiny is not None else (quick if quick is not None else full)
        if self.scale == "quick":
            return quick if quick is not None else full
        return full

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    # -- tensors -------------------------------------------------------------------------------------
    def randn(self, *shape: int, dtype: Any = None, scale: float = 1.0, channels_last: bool = False) -> Any:
        import torch

        t = torch.randn(*shape, device=self.device, dtype=torch.float32).mul_(scale).to(dtype or torch.float16)
        return t.to(memory_format=torch.channels_last) if channels_last else t

    def rand(
        self, *shape: int, dtype: Any = None, lo: float = 0.0, hi: float = 1.0, channels_last: bool = False
    ) -> Any:
        import torch

        t = (torch.rand(*shape, device=self.device, dtype=torch.float32) * (hi - lo) + lo).to(dtype or torch.float16)
        return t.to(memory_format=torch.channels_last) if channels_last else t


def dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    return {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)
