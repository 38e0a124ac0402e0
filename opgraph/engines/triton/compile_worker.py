"""A compile worker: a separate Python process that compiles generated Triton kernels for a GPU
target and leaves the results in Triton's on-disk cache, where the process that started it finds
them without compiling (opgraph.engines.triton.compiler).

It runs as a script (`python compile_worker.py`), not as part of the package, so that starting it
imports Triton and nothing else (no PyTorch, no opgraph, no CUDA context): it reads one JSON job per
line on stdin and answers one JSON line per job on stdout. Jobs carry everything a compilation needs
(the generated module's file, the kernel, its signature, constexprs, aligned pointers, options and
target); `compile_spec` is the single definition of how a job compiles, used here and in-process.

This module imports nothing from opgraph: `exec_generated` is also how opgraph's own loader turns
generated source into Triton functions, so both sides hash the same kernels the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Mapping
from types import ModuleType
from typing import Any

PATH_ENV = "OPGRAPH_COMPILE_WORKER_PATH"  # the parent's sys.path (custom ops' modules import from it)


def exec_generated(path: str, name: str, jit: bool) -> ModuleType:
    """Import a generated module from `path` as `name`: top-level `kernel*` functions become Triton
    kernels and `_og_*` functions Triton device functions (JITFunction, whatever TRITON_INTERPRET
    says, when `jit`); otherwise kernels become interpreted functions and helpers stay Python."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if jit:
        from triton.runtime.jit import JITFunction

        jit_class: Any = JITFunction
        if getattr(module, "_OG_GLUON", False):  # (a Gluon module: gluon_prelude.py)
            from triton.experimental.gluon._runtime import GluonJITFunction

            jit_class = GluonJITFunction
    else:
        from triton.runtime.interpreter import InterpretedFunction
    triton_kernels = set(getattr(module, "_OG_TRITON", ()))  # (a Gluon module's Triton kernels: gluon_prelude.py)
    used = _reachable(path) if jit else None
    sizes = tuple(getattr(module, "_OG_SIZES", ()))  # run-time sizes: never specialised on (== 1, % 16)
    for attr in list(vars(module)):
        fn = getattr(module, attr)
        if not callable(fn) or not (attr.startswith("kernel") or attr.startswith("_og_")):
            continue
        if used is not None and attr not in used:
            continue  # a helper no kernel calls: wrapping it costs Triton a parse of its source
        if jit:
            if not isinstance(fn, JITFunction):  # a custom op's function its module already jitted stays as is
                fixed = [p for p in sizes if p in fn.__code__.co_varnames[: fn.__code__.co_argcount]]
                cls = JITFunction if attr in triton_kernels else jit_class
                setattr(module, attr, cls(fn, do_not_specialize=fixed) if fixed else cls(fn))
        elif attr.startswith("kernel"):
            setattr(module, attr, InterpretedFunction(fn))
    return module


_DEF = re.compile(r"^def (\w+)\(", re.M)
_NAME = re.compile(r"\b(_og_\w+)\b")  # (any mention: a helper passed on as a value too)
_COMMENT = re.compile(r"#[^\n]*")


def function_bodies(text: str) -> dict[str, str]:
    """A module's top-level functions by name, each its text up to the next one's `def`."""
    starts = [(m.group(1), m.start()) for m in _DEF.finditer(text)]
    return {
        name: text[at : (starts[i + 1][1] if i + 1 < len(starts) else len(text))] for i, (name, at) in enumerate(starts)
    }


def reached(bodies: Mapping[str, str], text: str) -> set[str]:
    """The `_og_` functions of `bodies` that `text`'s code names (comments left out: they name others in
    passing), and those their code names, transitively."""
    seen: set[str] = set()
    todo = [text]
    while todo:
        for name in _NAME.findall(_COMMENT.sub("", todo.pop())):
            if name in bodies and name not in seen:
                seen.add(name)
                todo.append(bodies[name])
    return seen


def _reachable(path: str) -> set[str]:
    """The module's `kernel*` functions and the `_og_` helpers they call, directly or through other
    helpers (a module may carry others, a custom op's or another kernel's: 23 JITFunctions a module
    made a 400-kernel plan spend ~6 s in Triton's source parsing before anything compiled)."""
    with open(path) as f:
        bodies = function_bodies(f.read())
    kernels = [name for name in bodies if name.startswith("kernel")]
    return set(kernels) | reached(bodies, "\n".join(bodies[k] for k in kernels))


def ast_source(fn: Any, job: dict[str, Any]) -> Any:
    """Triton's ASTSource of a job: signature {param: type}, constexprs {(index,): value}, the
    16-byte-aligned pointers as tt.divisibility attributes."""
    from triton.compiler import ASTSource

    signature = {name: ty for name, ty in job["signature"]}
    constexprs = {(int(i),): v for i, v in job["constexprs"]}
    attrs = {(int(i),): [["tt.divisibility", 16]] for i in job["aligned"]}
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource(fn, signature, constexprs, attrs)
    return ASTSource(fn, signature, constexprs, attrs)


def compile_spec(fn: Any, job: dict[str, Any]) -> tuple[Any, bool]:
    """Compile (or find in Triton's cache) one job: (CompiledKernel, whether it was a cache hit)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    hits: list[bool] = []
    previous = knobs.compilation.listener

    def listener(**kwargs: Any) -> None:
        hits.append(bool(kwargs.get("cache_hit")))
        if previous is not None:
            previous(**kwargs)

    knobs.compilation.listener = listener
    try:
        backend, arch, warp = job["target"]
        kernel = triton.compile(
            ast_source(fn, job), target=GPUTarget(backend, int(arch), int(warp)), options=dict(job["options"])
        )
    finally:
        knobs.compilation.listener = previous
    return kernel, bool(hits and hits[-1])


def _serve() -> None:
    paths = json.loads(os.environ.get(PATH_ENV, "[]"))
    sys.path[:] = [p for p in paths if p] + [p for p in sys.path if p not in paths]
    modules: dict[str, ModuleType] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        t0 = time.perf_counter()
        try:
            module = modules.get(job["module"])
            if module is None:
                module = modules[job["module"]] = exec_generated(job["path"], job["module"], jit=True)
            _, hit = compile_spec(getattr(module, job["kernel"]), job)
            answer = {"id": job["id"], "ok": True, "cache_hit": hit}
        except BaseException as err:  # noqa: BLE001 - reported to the parent, which decides
            answer = {
                "id": job["id"],
                "ok": False,
                "error": f"{type(err).__name__}: {err}"[:2000],
                "trace": traceback.format_exc()[-4000:],
            }
        answer["seconds"] = time.perf_counter() - t0
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    # run as a script: its own folder is not an import root
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    _serve()
