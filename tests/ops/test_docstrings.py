"""Every public op builder documents its shapes, layouts, types, formula and an example (issue 20:
`gelu` said "x*Phi(x)", matmul's `padding` was unexplained), and every argument it takes."""

from __future__ import annotations

import inspect

import pytest

from opgraph.core.op import BUILDERS

SECTIONS = ("Shapes", "Layouts", "Types", "Formula", "Args:", "Returns:", "Example:")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builder_docstring(name):
    fn = BUILDERS[name]
    doc = inspect.getdoc(fn) or ""
    missing = [s for s in SECTIONS if s not in doc]
    assert not missing, f"{name}: no {missing} in its docstring"
    args = doc.split("Args:", 1)[1].split("Returns:", 1)[0]
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        label = {p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, p.name)
        assert f"\n    {label}:" in "\n" + args.replace("\n        ", "\n    "), (
            f"{name}: argument {label} undocumented"
        )
    assert f"g.{name}(" in doc or name in ("pointwise",) and "g.pointwise(" in doc, (
        f"{name}: the example does not call it"
    )
