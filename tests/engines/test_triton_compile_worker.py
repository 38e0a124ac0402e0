"""The compile worker's module loading (opgraph/engines/triton/compile_worker.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_only_helpers_a_kernel_calls_become_triton_functions(tmp_path):
    """exec_generated JIT-wraps a module's kernels and the `_og_` helpers they reach (directly or
    through other helpers), not others a module may carry: each wrap costs Triton a parse of the
    helper's source (half of a 400-kernel plan's build time on the CPU). module_source leaves the
    helpers no kernel reaches out of the module (their Python compile was a quarter of its load)."""
    from triton.runtime.jit import JITFunction

    from opgraph.engines.triton.compile_worker import exec_generated
    from opgraph.engines.triton.templates.base import module_source

    body = "def kernel(p0, p1):\n    x = tl.load(p0)\n    tl.store(p1, _og_to_bf16(_og_tanh(x)))\n"
    path = tmp_path / "og_probe_helpers.py"
    path.write_text(module_source(body))
    module = exec_generated(str(path), "og_probe_helpers", jit=True)
    wrapped = {name for name, fn in vars(module).items() if isinstance(fn, JITFunction)}
    # _og_tanh calls _og_expm1, _og_abs and _og_neg; the casts and the rest are not reached
    assert wrapped == {"kernel", "_og_to_bf16", "_og_tanh", "_og_expm1", "_og_abs", "_og_neg"}, wrapped
    assert not hasattr(module, "_og_pow")


def test_a_module_holds_the_helpers_its_kernels_reach_in_their_order():
    from opgraph.engines.triton.expr import HELPERS, helpers_for
    from opgraph.engines.triton.templates.base import module_source

    text = helpers_for("y = _og_tanh(x)")
    names = [line[4:].split("(")[0] for line in text.splitlines() if line.startswith("def ")]
    assert names == sorted(names, key=lambda n: HELPERS.index(f"def {n}(")) and set(names) == {
        "_og_tanh",
        "_og_expm1",
        "_og_abs",
        "_og_neg",
    }
    assert helpers_for("y = tl.exp(x)") == "" and "def _og_" not in module_source("def kernel(p0):\n    pass\n")
    # a helper named without a call (passed on as a value) is kept too
    assert "def _og_floor(" in helpers_for("f = _og_floor")
