"""Compiling generated kernels before their first launch: specs, binaries and the registry.

A `KernelSpec` is one generated kernel specialised for one launch: the generated module up to the
names of its kernels' parameters and locals (generated code names values by UID, so the repeated
blocks of a network generate kernels that differ in names only: `canonical_digest`), the kernel's
parameters' types, the
constexpr values, which pointers are 16-byte aligned (all of them: every buffer the runtime binds is
checked for it, and an unaligned one takes Triton's own launch path), the options (warps, stages) and
the GPU target. It is what Triton compiles, in this process or in a worker process
(compile_worker.compile_spec is the one definition of both). A `KernelBinary` is the result: the
cubin and Triton's metadata, which opgraph's native launcher (native.py) loads and launches.

Binaries live in a process-wide registry keyed by the spec's hash, so identical kernels (the repeated
blocks of a network, or two plans of the same graph) compile once; opgraph's kernel cache keeps them
across processes (kernels/bin/<key>.cubin and .json beside the generated sources; the main process
reads what a worker compiled from Triton's cache, without asking Triton to compile); plan files embed
them (opgraph.engines.artifacts), so a loaded plan compiles nothing: a file's binaries serve the plan
that carries it only (looked up while it loads or binds) and never enter the registry. `STATS["compiled"]` counts the
kernels this process had compiled (by itself or its workers): the test hook for "nothing compiled".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ...core.cache import describe, fault, unwritable, write_atomic
from ...core.dtypes import DataType
from ...core.errors import ExecutionError
from .. import artifacts
from ..base import CompileReport
from . import native
from .compile_worker import compile_spec
from .loader import cache_dir, source_hash

log = logging.getLogger("opgraph.compile")

STATS = {"compiled": 0, "loaded": 0, "embedded": 0}
ARTIFACT_KIND = "triton"
_BINARIES: dict[str, KernelBinary] = {}


def compilations() -> int:
    """Kernels compiled by this process and its workers so far (cache hits and embedded kernels
    excluded)."""
    return STATS["compiled"]


def triton_version() -> str:
    import triton

    return str(triton.__version__)


def target_of(capability: tuple[int, int] | None) -> tuple[str, int, int]:
    major, minor = capability or (9, 0)
    return ("cuda", major * 10 + minor, 32)


def _canonical(name: str) -> str:
    from triton._utils import type_canonicalisation_dict

    return type_canonicalisation_dict[name]


def pointer_type(data_type: DataType) -> str:
    """Triton's signature type of a pointer to `data_type` elements (as its JIT names a tensor's)."""
    return "*" + _canonical(str(data_type.to_torch()).split(".")[-1])


def scratch_type(dtype: str) -> str:
    return "*" + _canonical(dtype)


_CANON: dict[str, str] = {}


_PRELUDES: dict[str, str] = {}  # a module's text before its first kernel -> that text unparsed


def alpha_renamed(source: str) -> str:
    """The module with each kernel's parameters and local variables renamed by order of appearance:
    kernels that differ only in those names (UIDs, in generated code) become the same text. The
    helpers before the first kernel (the same few subsets of HELPERS in most modules) are parsed once a
    process; joined with two newlines, as unparsing the whole module joins them."""
    import ast

    cut = source.find("\ndef kernel")
    if cut <= 0 or source.startswith("def kernel"):
        return _kernels_renamed(source)
    prelude = source[: cut + 1]
    head = _PRELUDES.get(prelude)
    if head is None:
        try:
            head = ast.unparse(ast.parse(prelude))
        except SyntaxError:  # (not cut between top-level statements: a decorated kernel, a string)
            return _kernels_renamed(source)
        if len(_PRELUDES) >= 64:
            _PRELUDES.clear()
        _PRELUDES[prelude] = head
    tail = _kernels_renamed(source[cut + 1 :])
    return f"{head}\n\n{tail}" if head else tail


def _kernels_renamed(source: str) -> str:
    import ast

    tree = ast.parse(source)
    for fn in tree.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("kernel")):
            continue
        local = {a.arg for a in fn.args.args}
        local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        names: dict[str, str] = {}
        for a in fn.args.args:
            names.setdefault(a.arg, f"_a{len(names)}")
        uses = sorted(
            (n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in local),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for n in uses:
            names.setdefault(n.id, f"_a{len(names)}")
        for a in fn.args.args:
            a.arg = names[a.arg]
        for n in uses:
            n.id = names[n.id]
    return ast.unparse(tree)


def canonical_digest(source: str) -> str:
    """A hash of a generated module up to its kernels' parameter and local names (kept next to the
    source in the kernel cache: og_<hash>.canon)."""
    digest = source_hash(source)
    found = _CANON.get(digest)
    if found is not None:
        return found
    path = cache_dir() / f"og_{digest}.canon"
    try:
        found = path.read_bytes().decode("ascii").strip()
    except (OSError, ValueError):  # absent, unreadable or corrupt: computed again
        found = ""
    if len(found) != 32 or any(c not in "0123456789abcdef" for c in found):
        found = hashlib.sha256(alpha_renamed(source).encode()).hexdigest()[:32]
        try:
            write_atomic(path, found.encode())
        except OSError:
            pass
    _CANON[digest] = found
    return found


@dataclass(frozen=True)
class KernelSpec:
    path: str  # the generated module's file (this machine's cache)
    module: str  # its module name: holds the source's hash
    kernel: str
    signature: tuple[tuple[str, str], ...]  # (parameter, Triton type or "constexpr"), in order
    constexprs: tuple[tuple[int, Any], ...]
    # parameters specialised as multiples of 16 (tt.divisibility): every pointer (16-byte aligned), and each
    # run-time size whose every value is one (a dynamic size's known divisor: its masks and strides let
    # Triton vectorise the accesses, as a literal size does)
    aligned: tuple[int, ...]
    options: tuple[tuple[str, Any], ...]
    target: tuple[str, int, int]
    canonical: str = ""  # canonical_digest of the module

    def job(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "module": self.module,
            "kernel": self.kernel,
            "signature": [list(p) for p in self.signature],
            "constexprs": [list(c) for c in self.constexprs],
            "aligned": list(self.aligned),
            "options": [list(o) for o in self.options],
            "target": list(self.target),
        }

    @cached_property
    def key(self) -> str:
        """Everything that defines the compiled code: the module up to names, the kernel, its parameters'
        types, constexprs, alignment, options, target and the Triton version (not names or paths)."""
        doc = {
            "module": self.canonical or self.module,
            "kernel": self.kernel,
            "types": [ty for _, ty in self.signature],
            "constexprs": [list(c) for c in self.constexprs],
            "aligned": list(self.aligned),
            "options": [list(o) for o in self.options],
            "target": list(self.target),
            "triton": triton_version(),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]

    @property
    def runtime(self) -> list[tuple[int, str]]:
        """(parameter index, type) of the parameters a launch passes."""
        return [(i, ty) for i, (_, ty) in enumerate(self.signature) if ty != "constexpr"]


def param_names(fn: Any) -> list[str]:
    names = getattr(fn, "arg_names", None)
    if names is None:
        import inspect

        names = list(inspect.signature(getattr(fn, "fn", fn)).parameters)
    return list(names)


def make_spec(
    fn: Any,
    path: str,
    module: str,
    kernel: str,
    arg_types: Sequence[str],
    meta: Mapping[str, Any],
    target: tuple[str, int, int],
    canonical: str = "",
    multiples_of_16: Sequence[int] = (),
) -> KernelSpec | None:
    """The spec of launching `fn` with runtime arguments of `arg_types` and `meta` (constexprs and
    options); None when a constexpr has no value here (Triton's JIT then decides). `multiples_of_16`:
    the indices of integer arguments that are multiples of 16 at every launch."""
    names = param_names(fn)
    n = len(arg_types)
    signature = [(name, arg_types[i] if i < n else "constexpr") for i, name in enumerate(names)]
    constexprs = []
    for i, name in enumerate(names[n:], start=n):
        if name not in meta:
            return None
        value = meta[name]
        if not (value is None or isinstance(value, (bool, int, float, str))):
            return None
        constexprs.append((i, value))
    options = tuple(sorted((k, v) for k, v in meta.items() if k not in names))
    if not all(v is None or isinstance(v, (bool, int, float, str)) for _, v in options):
        return None
    aligned = tuple(i for i, ty in enumerate(arg_types) if ty.startswith("*") or i in multiples_of_16)
    return KernelSpec(path, module, kernel, tuple(signature), tuple(constexprs), aligned, options, target, canonical)


@dataclass(frozen=True, eq=False)
class KernelBinary:
    key: str
    cubin: bytes
    metadata: dict[str, Any]
    sha256: str = field(default="")

    def __post_init__(self) -> None:
        if not self.sha256:
            object.__setattr__(self, "sha256", hashlib.sha256(self.cubin).hexdigest())

    @property
    def identity(self) -> str:
        """The spec's key and the cubin's SHA-256: what a loaded CUDA module is cached under, so that two
        binaries of one spec (this machine's and a plan file's) never stand in for each other."""
        return f"{self.key}.{self.sha256}"

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    def meta(self, name: str, default: Any = None) -> Any:
        return self.metadata.get(name, default)

    def artifact(self) -> artifacts.Artifact:
        return artifacts.Artifact(ARTIFACT_KIND, self.key, self.cubin, {"metadata": self.metadata})


def _binary(spec: KernelSpec, metadata_text: str, cubin: bytes) -> KernelBinary:
    return KernelBinary(spec.key, cubin, json.loads(metadata_text), hashlib.sha256(cubin).hexdigest())


def _bin_path(key: str) -> Path:
    return cache_dir() / "bin" / key


def _disk_get(spec: KernelSpec) -> KernelBinary | None:
    """The spec's binary from opgraph's cache; None when absent, for another Triton, or unusable
    (unreadable, corrupt: a CacheWarning naming the file, and it is compiled again)."""
    base = _bin_path(spec.key)
    try:
        cubin = base.with_suffix(".cubin").read_bytes()
        metadata = json.loads(base.with_suffix(".json").read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as err:
        fault(
            base.with_suffix(".json"),
            f"cannot be used ({describe(err)}); compiled again",
            "remove it, or run `opgraph cache clear`",
        )
        return None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("name"), str):
        fault(
            base.with_suffix(".json"),
            "is not a kernel's metadata; compiled again",
            "remove it, or run `opgraph cache clear`",
        )
        return None
    binary = KernelBinary(spec.key, cubin, metadata, hashlib.sha256(cubin).hexdigest())
    return binary if binary.meta("triton_version") == triton_version() else None


def _disk_put(binary: KernelBinary) -> None:
    base = _bin_path(binary.key)
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for suffix, data in ((".cubin", binary.cubin), (".json", json.dumps(binary.metadata).encode())):
            write_atomic(base.with_suffix(suffix), data)  # the metadata last: a reader needs both
    except OSError as err:  # a read-only cache: compiled again next time
        unwritable(err)


def registered(spec: KernelSpec) -> KernelBinary | None:
    """The spec's binary if this process has it (compiled already, or read from the kernel cache),
    else the one embedded in the plan being loaded or bound in this thread (opgraph.engines.artifacts:
    used by that plan only, never registered here)."""
    found = _BINARIES.get(spec.key)
    if found is not None:
        return found
    return artifacts.decoded(ARTIFACT_KIND, spec.key, lambda art: _embedded(spec, art))


def _embedded(spec: KernelSpec, art: artifacts.Artifact) -> KernelBinary | None:
    """A plan file's binary for `spec`, checked: for this Triton version and target, with metadata
    the launcher can read; where this machine's kernel cache holds the spec's binary, that one (a
    file's kernel never replaces a kernel compiled here; a differing one is logged and not used).
    None: compile instead."""
    meta = art.meta.get("metadata")
    if not (isinstance(meta, dict) and isinstance(meta.get("name"), str)):
        log.warning("plan file kernel %s has no readable metadata: compiling it instead", spec.kernel)
        return None
    binary = KernelBinary(art.key, art.data, dict(meta), art.sha256)
    target = binary.meta("target") or {}
    if (
        binary.meta("triton_version") != triton_version()
        or not isinstance(target, dict)
        or [target.get("backend"), target.get("arch"), target.get("warp_size")] != list(spec.target)
    ):
        return None
    local = _disk_get(spec)
    if local is not None:
        if local.sha256 != binary.sha256:
            log.warning(
                "plan file kernel %s (%s) differs from the one compiled on this machine for the same "
                "source and options: using this machine's",
                spec.kernel,
                spec.key,
            )
        _BINARIES[spec.key] = local
        STATS["loaded"] += 1
        return local
    STATS["embedded"] += 1
    return binary


def _cached(spec: KernelSpec, fn: Any) -> KernelBinary | None:
    """The spec's cubin and metadata from Triton's disk cache, read without compiling (the lookup
    Triton's compile makes); None when absent or when this Triton's cache cannot be read so."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import get_cache_key, get_cache_manager

        from .compile_worker import ast_source

        job = spec.job()
        backend = make_backend(GPUTarget(*spec.target))
        src = ast_source(fn, job)
        options = backend.parse_options(dict(dict(job["options"]), **src.parse_options()))
        key = get_cache_key(src, backend, options, env_vars=get_cache_invalidating_env_vars())
        manager = get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        name = src.name[:150]
        group = manager.get_group(f"{name}.json") or {}
        meta_path, bin_path = group.get(f"{name}.json"), group.get(f"{name}.{backend.binary_ext}")
        if meta_path is None or bin_path is None:
            return None
        return _binary(spec, Path(meta_path).read_text(), Path(bin_path).read_bytes())
    except Exception as err:  # noqa: BLE001 - another Triton's cache layout: compile instead
        log.debug("cache lookup failed for %s: %s", spec.kernel, err)
        return None


def compile_here(
    spec: KernelSpec, fn: Any, *, compiled_elsewhere: bool = False, isolated: bool = False
) -> KernelBinary:
    """Find the spec's binary in the caches, else compile it, and register it. `isolated`: the compile
    runs in a worker process, so a compiler that aborts (an LLVM assertion) fails the kernel, not this
    process (ExecutionError); else in this process. `compiled_elsewhere`: a worker has just compiled
    it (and was counted), so this reads its result: counted as loaded."""
    found = registered(spec)
    if found is not None:
        return found
    if isolated:
        return _compile_isolated(spec, fn)
    found = _disk_get(spec)
    if found is not None:
        STATS["loaded"] += 1
    else:
        found = _cached(spec, fn)
        if found is None:
            kernel, hit = compile_spec(fn, spec.job())
            STATS["compiled" if not (hit or compiled_elsewhere) else "loaded"] += 1
            meta_path = next(p for c, p in kernel.metadata_group.items() if c.endswith(".json"))
            found = _binary(spec, Path(meta_path).read_text(), bytes(kernel.kernel))
        _disk_put(found)
    _BINARIES[spec.key] = found
    return found


# spec key -> why it failed to compile in a worker: this process does not compile it again
_FAILED: dict[str, str] = {}


def _compile_isolated(spec: KernelSpec, fn: Any) -> KernelBinary:
    """compile_here(isolated=True): compile_all of the one spec (in a worker, the caches first);
    ExecutionError when it has no binary; in this process where no worker process can be started."""
    try:
        report = compile_all({spec.key: (spec, fn)}, parallel=True)
    except OSError as err:  # (no subprocess here: an embedded or sandboxed interpreter)
        log.warning("no compile worker (%s): compiling %s in this process", err, spec.kernel)
        return compile_here(spec, fn)
    found = registered(spec)
    if found is None:
        raise ExecutionError(
            f"kernel {spec.kernel} ({spec.module}) failed to compile: {report.failed.get(spec.key)}",
            rule="triton.compile_failed",
            hint="build the graph with another engine or config, and report the graph (OPGRAPH_LOG=info logs "
            "the compiler's traceback)",
        )
    return found


def compile_all(
    specs: Mapping[str, tuple[KernelSpec, Any]],
    *,
    parallel: bool = True,
    progress: Callable[[int, int], None] | None = None,
    pool: Any = None,
) -> CompileReport:
    """Make every spec's binary available ({key: (spec, Triton function)}): registered ones as they
    are, cached ones read from disk, the rest compiled in worker processes, so a compiler that aborts
    takes a worker down, not this process (in this process when `parallel` is off, as compile="serial"
    asks, unless Triton's interpreter is on here). Failures are reported, not raised."""
    t0 = time.perf_counter()
    report = CompileReport(kernels=len(specs))
    missing: list[tuple[KernelSpec, Any]] = []
    for spec, fn in specs.values():
        if spec.key in _FAILED:
            report.failed[spec.key] = _FAILED[spec.key]
        elif registered(spec) is not None:
            report.ready += 1
        elif (found := _disk_get(spec)) is not None:
            _BINARIES[spec.key] = found
            STATS["loaded"] += 1
            report.cached += 1
        else:
            missing.append((spec, fn))
    done = len(specs) - len(missing)
    if progress:
        progress(done, len(specs))
    # Triton's interpreter, once on in a process, patches triton.language for good: kernels then compile
    # in workers only
    interpreting = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if missing and (parallel or interpreting):
        if pool is None:
            from .pool import shared_pool

            pool = shared_pool()
        report.workers = min(pool.size, len(missing))
        by_id = {str(i): (spec, fn) for i, (spec, fn) in enumerate(missing)}

        def finished(job: dict[str, Any], answer: dict[str, Any]) -> None:
            nonlocal done
            spec, fn = by_id[job["id"]]
            if answer.get("ok"):
                STATS["compiled"] += not answer.get("cache_hit")
                report.compiled += not answer.get("cache_hit")
                found = _cached(spec, fn)
                if found is None:  # the worker's cache is not readable here: compile (a cache hit) here
                    try:
                        found = compile_here(spec, fn, compiled_elsewhere=True)
                    except Exception as err:  # noqa: BLE001 - as below: the caller decides
                        report.failed[spec.key] = f"{type(err).__name__}: {err}"
                if found is not None:
                    _BINARIES[spec.key] = found
                    _disk_put(found)
            else:
                report.failed[spec.key] = _FAILED[spec.key] = str(answer.get("error"))
                log.info("compiling %s failed in a worker: %s", spec.kernel, answer.get("trace") or answer.get("error"))
            done += 1
            if progress:
                progress(done, len(specs))

        pool.run([{**spec.job(), "id": i} for i, (spec, _) in by_id.items()], finished)
    else:
        for spec, fn in missing:
            before = STATS["compiled"]
            try:
                compile_here(spec, fn)
            except Exception as err:  # noqa: BLE001 - the caller decides (another config, or raise)
                report.failed[spec.key] = f"{type(err).__name__}: {err}"
            report.compiled += STATS["compiled"] - before
            done += 1
            if progress:
                progress(done, len(specs))
    _refuse_oversized(specs, report)
    report.seconds = time.perf_counter() - t0
    return report


def _refuse_oversized(specs: Mapping[str, tuple[KernelSpec, Any]], report: CompileReport) -> None:
    """A binary that asks for more shared memory than the device has is a failed compile, so the build
    moves on to the step's next config instead of the plan failing at its first bind."""
    for spec, _ in specs.values():
        binary = _BINARIES.get(spec.key)
        if binary is None or spec.key in report.failed:
            continue
        try:
            why = native.too_big(int(binary.meta("shared", 0) or 0))
        except (OSError, ExecutionError):  # no CUDA driver here (a build for a plan file): the bind checks
            return
        if why:
            report.failed[spec.key] = f"kernel {spec.kernel} {why}"
