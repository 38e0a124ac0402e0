"""Backward rules of the custom ops opgraph itself emits (ops/builtin_custom.py): stop_gradient passes
no gradient."""

from __future__ import annotations

from ..ops.builtin_custom import STOP_GRADIENT, ensure_registered
from .rules import CUSTOM_RULES, register_custom_grad


def ensure_rules() -> None:
    """Register the rules (again, if a test emptied the registries)."""
    ensure_registered()
    if STOP_GRADIENT not in CUSTOM_RULES:
        register_custom_grad(STOP_GRADIENT, lambda ctx: {}, inputs=())


ensure_rules()
