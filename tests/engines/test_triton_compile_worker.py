"""The compile worker's module loading (opgraph/engines/triton/compile_worker.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def test_only_helpers_a_kernel_calls_become_triton_functions(tmp_path):
    """exec_generated JIT-wraps a module's kernels and the `_og_` helpers they reach (directly or
    through other helpers), not the ~20 unused ones every generated module carries: each wrap costs
    Triton a parse of the helper's source (half of a 400-kernel plan's build time on the CPU)."""
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
    assert callable(module._og_pow) and not isinstance(module._og_pow, JITFunction)
