"""The one kind of registry opgraph keeps: a name -> thing table filled by `register`, which refuses a
name already taken by something else (a second registration silently winning is how one translator
once shadowed another). Op kinds, builders, engines, torch mappings, backward rules, cuDNN lowerings,
importer translators and custom ops all live in one.

    RULES: Registry[str, Rule] = Registry("backward rule", same=lambda rule: rule.fn)
    RULES.register("matmul", rule)               # RegistrationError if "matmul" holds another rule
    RULES.register("matmul", rule, replace=True)  # on purpose

Registering the very same thing again is a no-op (a module imported twice, an `ensure_registered`
after a test emptied the table). A registry is a dict for everything else (`in`, `get`, iteration;
tests save and restore one with `dict(reg)` / `clear` / `update`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .errors import RegistrationError

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def describe(value: Any) -> str:
    """A registered thing as a reader finds it: `module.qualname` for functions and classes."""
    target = getattr(value, "fn", value)  # (a rule or a definition wrapping a function)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and name:
        return f"{module}.{name}"
    return f"a {type(value).__name__}"


class Registry(dict[K, V]):
    """A dict of `what`s whose entries are added by `register` (see the module docstring). `same(v)`
    gives what identifies an entry (default: the entry itself): registering an entry whose identity
    equals the present one's is a no-op."""

    def __init__(self, what: str, *, same: Callable[[V], Any] | None = None) -> None:
        super().__init__()
        self.what = what
        self._same = same

    def _identity(self, value: V) -> Any:
        return value if self._same is None else self._same(value)

    def register(self, key: K, value: V, *, replace: bool = False) -> V:
        """Add `value` under `key`; a RegistrationError if `key` holds something else, unless `replace`."""
        if key in self and not replace:
            old = self[key]
            a, b = self._identity(old), self._identity(value)
            if a is not b and a != b:
                raise RegistrationError(
                    f"{self.what} {key!r} is already registered ({describe(old)}); registering {describe(value)} "
                    "under the same name would replace it",
                    rule="registry.duplicate",
                    hint=f"give the new {self.what} another name, remove the first registration, or replace it on "
                    "purpose (replace=True)",
                )
        self[key] = value
        return value

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {len(self)} entries)"
