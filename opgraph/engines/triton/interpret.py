"""Triton's interpreter, decided per kernel rather than per process.

Triton reads TRITON_INTERPRET when a function is decorated with `@triton.jit`, and its own library
(`tl.sigmoid`, `tl.sum`, `tl.cdiv`, ...) is decorated when `triton` is first imported. Imported
without the variable (by PyTorch, a model import, or the user's own `import triton`), those library
functions are `JITFunction`s, which refuse to be called from interpreted code ("Cannot call
@triton.jit'd outside of the scope of a kernel"). opgraph wraps its CPU kernels in the interpreter
itself (`loader._wrap`), and while one of them runs, `interpreting_here()` makes any `JITFunction`
it calls (Triton's library or a custom op's function) run through the interpreter too. So the
engine on the CPU works whatever was imported first, and nothing outside an opgraph launch changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

_STATE = threading.local()
_INSTALLED = False
_LOCK = threading.Lock()
# Triton's interpreter patches triton.language module-wide for the length of a launch and keeps the
# program id in one global builder: two interpreted launches at once break each other (an
# InterpreterError, or wrong program ids), so opgraph's interpreted launches take turns
_RUNNING = threading.RLock()


def interpret_env() -> bool:
    """Whether TRITON_INTERPRET asks for the interpreter (Triton's own rule: set and not '0')."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_imported_interpreting() -> bool:
    """Whether Triton's library is (or, not imported yet, will be) in interpreter form in this process:
    it then cannot compile for a GPU here."""
    if "triton" not in sys.modules:
        return interpret_env()  # Triton will read the variable when it is imported
    try:
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - a Triton without these modules
        return interpret_env()
    return isinstance(getattr(standard, "sigmoid", None), InterpretedFunction)


def _install() -> None:
    """Teach JITFunction.__call__ to run through the interpreter inside an opgraph interpreted launch
    (outside one it behaves exactly as before: Triton raises)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        original = JITFunction.__call__
        interpreted: dict[int, Any] = {}

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(_STATE, "depth", 0):
                return original(self, *args, **kwargs)
            fn = interpreted.get(id(self))
            if fn is None:
                fn = interpreted[id(self)] = InterpretedFunction(self.fn)
                fn._og_owner = self  # keeps id(self) from being reused while cached
            return fn(*args, **kwargs)

        JITFunction.__call__ = __call__
        _INSTALLED = True


@contextlib.contextmanager
def interpreting_here() -> Iterator[None]:
    """Run interpreted kernels inside this block (one thread at a time: Triton's interpreter is not
    thread-safe): the JITFunctions they call are interpreted too."""
    _install()
    depth = getattr(_STATE, "depth", 0)
    with _RUNNING:
        _STATE.depth = depth + 1
        try:
            yield
        finally:
            _STATE.depth = depth
