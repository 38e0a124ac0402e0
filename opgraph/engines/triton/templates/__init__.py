"""Kernel templates of the Triton engine, one module each. A module exposes `TEMPLATE`; the engine
tries them by descending `priority` (GEMM-class before normalizations before reductions before
plain elementwise), so adding a template means adding a module."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Template


def discover() -> list[Template]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        template = getattr(module, "TEMPLATE", None)
        if template is not None:
            found.append(template)
    return sorted(found, key=lambda t: -t.priority)
