"""The engine interface every backend implements (the config/notes vocabulary is opgraph.core.config).

An engine answers four questions about a piece of graph: can you run it (and if not, why), which
configs would you use (knobs + notes, ranked by a heuristic mode), and give me a kernel for this
config. A kernel runs the piece over buffers keyed by UID. Two more serve the build: what the engine
knows of a supported piece (`facts`: its estimate and `PieceFact`s; the build's ranking policy,
opgraph.build.policy, decides from them whose configs go first), and the compiler of its kernels'
ahead-of-time work (`compiler`). Engines never import each other: they reach each other through the
registry (opgraph.engines.get_engine) and share code through opgraph.engines.shared.

The kernel contract, in the order a plan uses it:

- `compile_specs()`: work the build may do ahead of time and in parallel (the Triton engine's
  kernels to compile); default none. The build hands them to the compiler of the config's engine
  (`Engine.compiler()`, a `Compiler`), then the kernel finds the results in its engine's registry.
- `bind(binding, scratch) -> Launcher`: once per workspace a plan binds, everything about the step
  that does not change between executes is prepared (argument layouts, scratch views, grids); the
  launcher's `calls` are what an execute makes, and `rebind(uids)` takes new addresses or scalar
  values of some tensors. The default launcher calls `run` with the binding's buffers.
- `run(buffers, stream, scratch)`: one self-contained run (tuning, tests, the default launcher).
- `artifacts()`: compiled code a plan file may embed (see opgraph.engines.artifacts); default none.
- `needs_torch_stream`: whether the kernel launches through PyTorch's current stream (the runtime
  then makes the execute's stream current for it); kernels launching on the binding's raw stream
  handle say False.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..core.config import BehaviorNote, EngineConfig, HeurMode, NumericalNote, Support

if TYPE_CHECKING:
    from ..core.device import Device
    from ..core.piece import Piece

__all__ = [
    "BehaviorNote",
    "Binding",
    "CompileReport",
    "Compiler",
    "Engine",
    "EngineConfig",
    "EngineFacts",
    "HeurMode",
    "Kernel",
    "Launcher",
    "NumericalNote",
    "PieceFact",
    "RunLauncher",
    "StreamSlot",
    "Support",
]


Call = tuple[Callable[..., Any], tuple[Any, ...]]


class StreamSlot:
    """The raw stream handle (cudaStream_t as an int; 0 on the CPU) the current execute launches on,
    one object shared by every launcher of a binding: `handle` for Python callers, `c` the same value
    as a ctypes.c_void_p that prebuilt native argument tuples hold by reference."""

    __slots__ = ("handle", "c")

    def __init__(self, handle: int = 0) -> None:
        self.handle = handle
        self.c = ctypes.c_void_p(handle or None)

    def set(self, handle: int) -> None:
        if handle != self.handle:
            self.handle = handle
            self.c.value = handle or None


@dataclass
class Binding:
    """What a plan's steps are bound to, one object per bound workspace, updated in place by the
    runtime before it calls `Launcher.rebind`:

    buffers   uid -> the bound value: a device tensor or array (workspace tensors as views of the
              workspace, the address table under TABLE_KEY), a pass-by-value scalar as a Python
              number already rounded to its declared type
    pointers  uid -> the address of buffers[uid], read once when it was bound (no pass-by-value)
    stream    the stream of the current execute
    preludes  calls made once per execute before any step, keyed so that launchers sharing one
              (a CUDA context check, a library handle's stream) register it once
    reserved  (id(kernel), launch index) -> device memory the launch keeps for the binding's life,
              allocated when the thread's state was reserved (Kernel.global_scratch_bytes)
    """

    buffers: dict[int, Any] = field(default_factory=dict)
    pointers: dict[int, int] = field(default_factory=dict)
    stream: StreamSlot = field(default_factory=StreamSlot)
    preludes: dict[Any, Call] = field(default_factory=dict)
    reserved: dict[tuple[int, int], Any] = field(default_factory=dict)


class Launcher:
    """A kernel bound to a Binding. An execute makes its `calls` in order: `function(*args)`, each
    answering None or 0 on success and a nonzero CUDA error code on failure. `rebind(uids)` is told
    which tensors got new addresses or scalar values (already in the binding) and answers whether
    `calls` changed (the runtime then collects them again)."""

    def __init__(self, calls: Sequence[Call] = ()) -> None:
        self.calls: list[Call] = list(calls)

    def rebind(self, uids: Iterable[int]) -> bool:
        return False


class RunLauncher(Launcher):
    """The default: `Kernel.run` on the binding's buffers (the dict the runtime keeps current), on
    PyTorch's current stream, which the runtime makes the execute's."""

    def __init__(self, kernel: Kernel, binding: Binding, scratch: Any) -> None:
        self.kernel, self.buffers, self.scratch = kernel, binding.buffers, scratch
        # (the kernel's method, not one of this launcher's: no reference cycle to leave to the
        # garbage collector when a plan is dropped)
        super().__init__([(kernel.run, (binding.buffers, None, scratch))])


class Kernel(ABC):
    """A compiled piece. `run` reads and writes buffers keyed by UID (arrays or device tensors;
    pass-by-value scalars as Python numbers). See the module docstring for the whole contract."""

    scratch_bytes: int = 0  # private workspace the kernel needs, provided by the plan as `scratch`
    needs_torch_stream: bool = True  # launches through PyTorch's current stream
    # made by Engine.kernel_at from a bucket's kernel without building anything (no generation, no
    # compilation, no library planning): a dynamic plan counts the steps of a new shape that built
    repointed: bool = False

    def __init__(self, piece: Piece, config: EngineConfig) -> None:
        self.piece = piece
        self.config = config

    @abstractmethod
    def run(self, buffers: Mapping[int, Any], stream: Any = None, scratch: Any = None) -> None: ...

    def bind(self, binding: Binding, scratch: Any) -> Launcher:
        """The kernel bound to `binding` (and its scratch view of the plan's workspace)."""
        return RunLauncher(self, binding, scratch)

    def compile_specs(self) -> Sequence[Any]:
        """Compilation the build may do ahead of time, in parallel (engine-specific specs)."""
        return ()

    def global_scratch_bytes(self) -> dict[int, int]:
        """Device memory a launch keeps for the life of a binding, outside the plan's workspace
        (launch index -> bytes). The runtime allocates it when a thread's state is reserved
        (plan.reserve, or the first execute), so that no bind allocates inside a CUDA-graph capture."""
        return {}

    def artifacts(self) -> list[Any]:
        """Compiled code a plan file may embed (opgraph.engines.artifacts.Artifact)."""
        return []

    def source(self) -> str | None:
        """Generated source code, for engines that generate it."""
        return None

    def source_digest(self) -> str | None:
        """SHA-256 (hex) of what the generated source computes (None where the engine generates none): what a plan
        file stores and its loading compares. The text's own hash here; an engine whose identical pieces share
        one text under other names (the Triton engine) hashes it up to those names."""
        source = self.source()
        return None if source is None else hashlib.sha256(source.encode()).hexdigest()

    def detail(self) -> str | None:
        """What the plan's description says of this kernel beyond its config (None: nothing)."""
        return None

    def drop_cached_buffers(self) -> None:  # noqa: B027  (optional hook: most kernels keep nothing)
        """Forget anything kept from past runs' buffers (autotuning's timing buffers)."""


@dataclass
class CompileReport:
    """What a compiler did with a batch of compile specs."""

    kernels: int = 0  # distinct specs asked for
    ready: int = 0  # already in this process
    cached: int = 0  # read from a disk cache
    compiled: int = 0  # compiled (in workers or here)
    workers: int = 0
    seconds: float = 0.0
    failed: dict[str, str] = field(default_factory=dict)  # spec key -> error


class Compiler(Protocol):
    """An engine's ahead-of-time compiler (`Engine.compiler()`). Specs are what its kernels'
    `compile_specs()` give, (spec, payload) pairs, a spec's `key` naming the compiled kernel (identical
    kernels, one key). `compile_all` makes every spec's result available ({key: (spec, payload)}),
    reporting failures rather than raising them; `compile_here` makes one available (raising), compiling
    it in a worker process when `isolated`, else in this one."""

    def compile_all(
        self,
        specs: Mapping[str, tuple[Any, Any]],
        *,
        parallel: bool = True,
        progress: Callable[[int, int], None] | None = None,
    ) -> CompileReport: ...

    def compile_here(self, spec: Any, fn: Any, *, isolated: bool = False) -> Any: ...


class PieceFact(enum.Enum):
    """What an engine may report about a piece it supports (`EngineFacts.facts`), for the build's
    ranking policy (opgraph.build.policy) to read."""

    # the conv's epilogue sends the engine to generic runtime-fusion kernels rather than its fused ones
    RUNTIME_FUSED_EPILOGUE = "runtime_fused_epilogue"
    # the piece is one matmul whose operands and result are one 16-bit type: the vendor's GEMM runs it
    # as it is, writing the result in place (no casts, no copies)
    NATIVE_GEMM = "native_gemm"
    # one plan of the engine, built once, serves every shape of the piece's dynamic-plan bucket
    ONE_PLAN_PER_BUCKET = "one_plan_per_bucket"


@dataclass(frozen=True)
class EngineFacts:
    """An engine's report on a piece it supports: its estimate of the piece's device time (µs; None:
    no estimate, as on the CPU) and the facts it knows. The build's ranking policy decides with them."""

    estimate_us: float | None = None
    facts: frozenset[PieceFact] = frozenset()


class Engine(ABC):
    name: ClassVar[str]
    # whether the engine's pieces run neighbouring ops fused (the library engine's generated
    # prologue/epilogue): the partitioner then lets its piece take an op a preferred engine runs alone
    fuses_neighbours: ClassVar[bool] = False
    # whether a piece's outputs are written only once all of it was computed (copied out): an op may
    # then write its result over an input it reads at other elements (a one-op matmul over its own A)
    writes_after_compute: ClassVar[bool] = False
    # whether the engine's kernels take every size from the piece's tensors when they run and its config
    # does not depend on them: a kernel is then made again at another shape of its bucket with nothing
    # generated, compiled or planned (kernel_at: `repointed`)
    sizes_at_run_time: ClassVar[bool] = False

    @abstractmethod
    def available(self, device: Device) -> Support:
        """Whether this engine can run at all on `device` (libraries installed, right device kind)."""

    @abstractmethod
    def supports(self, piece: Piece, device: Device) -> Support:
        """Whether one kernel of this engine runs the whole piece."""

    @abstractmethod
    def configs(self, piece: Piece, device: Device, mode: HeurMode) -> list[EngineConfig]:
        """Configs for a supported piece, best first, as heuristic `mode` ranks them."""

    @abstractmethod
    def compile(self, piece: Piece, config: EngineConfig, device: Device) -> Kernel: ...

    def compiler(self) -> Compiler | None:
        """The compiler of the compile specs this engine's kernels give (`Kernel.compile_specs`); None
        where they give none. The build compiles through it, never through an engine's modules."""
        return None

    def kernel_at(self, kernel: Kernel, piece: Piece, device: Device) -> Kernel | None:
        """`kernel` (this engine's, compiled for a piece of a dynamic plan's bucket at one shape) for
        `piece`, the same piece at another shape of that bucket (the same nodes, inputs and outputs:
        its graph's `origin` names the shape), with the same config; None where that config does not
        run the piece at this shape (the build then chooses the piece's config again there). The
        default compiles the config for the piece where the engine supports it and still offers the
        config there (its knobs and notes, among the broadest mode's configs); for an engine of
        `sizes_at_run_time` it makes the kernel again with nothing generated and marks it `repointed`.
        Engines override it to re-point what takes its sizes at run time (the Triton engine's bucket
        kernels, the library engine's parts), marking the kernel `repointed` too."""
        if not self.supports(piece, device).ok:
            return None
        c = kernel.config
        if self.sizes_at_run_time:
            shaped = self.compile(piece, c, device)
            shaped.repointed = True
            return shaped
        offered = self.configs(piece, device, HeurMode.B)
        if not any(
            (o.knobs, o.numerical_notes, o.behavior_notes) == (c.knobs, c.numerical_notes, c.behavior_notes)
            for o in offered
        ):
            return None
        return self.compile(piece, c, device)

    def configs_at(self, piece: Piece, device: Device, env: Mapping[str, int]) -> list[EngineConfig]:
        """For a piece of a dynamic plan's bucket (at the bucket's hint): its configs whose one kernel
        serves every shape of the bucket (re-pointed by `kernel_at`), ranked and estimated (`estimate_us`)
        at the bucket's shape `env` (the dynamic dims' values), best first: where a bucket's step may run
        another tile at some of its shapes (build/tile_variants.py). The default: none."""
        return []

    def estimator(
        self, piece: Piece, config: EngineConfig, device: Device
    ) -> Callable[[Mapping[str, int]], float | None] | None:
        """For a piece of a dynamic plan's bucket (at its hint) and a config whose kernel serves the whole
        bucket: the estimate (µs) of that kernel at any shape of the bucket (`env`), cheap enough to ask
        at every new shape (the analysis made once, here). None (the default): no estimate."""
        return None

    def session(self) -> AbstractContextManager[None]:
        """The span of one build (partition, ranking, compilation): what the engine learns about the
        build's pieces may be kept within it and must be dropped when it ends, so that no cache outlives
        the graph it analysed (a piece holds its graph, whose tensors hold the user's graph and plans).
        The default keeps nothing."""
        return nullcontext()

    def facts(self, piece: Piece, device: Device) -> EngineFacts:
        """What this engine reports about a piece it supports, for the build's ranking policy
        (opgraph.build.policy, which decides whose configs go first). The default: nothing."""
        return EngineFacts()

    def rank_first(self, piece: Piece, device: Device) -> bool:
        """Deprecated, never asked: the build's ranking policy (opgraph.build.policy) decides which
        engine's configs go first, from the facts engines report (`facts`). Always False."""
        warnings.warn(
            "Engine.rank_first is deprecated and ignored: rules live in opgraph.build.policy",
            DeprecationWarning,
            stacklevel=2,
        )
        return False

    def inplace_safe(self, config: EngineConfig) -> bool:
        """Whether a kernel of this config may write an output over the buffer of an input that it
        reads element for element (an in-place update through the variant pack, opgraph.aliasing):
        every element of that input is read once, by the program that then writes the output's
        element at the same index (or outputs are written only after everything was computed).
        The default, False, refuses such packs for the engine's steps."""
        return False

    def engines_used(self, config: EngineConfig) -> frozenset[str]:
        """Every engine whose code a config of this engine runs (itself, and the parts of a composite)."""
        return frozenset({self.name})
