"""The triton engine on the CPU works whatever imported Triton first (issue 20): Triton decides at
import whether its own library (`tl.sigmoid`, `tl.sum`, ...) is interpreted, so a process that
imported Triton without TRITON_INTERPRET (PyTorch, a model import, the user's `import triton`) used to
fail with "Cannot call @triton.jit'd outside of the scope of a kernel" while `opgraph engines` said
triton was available. Each case runs in a fresh process without the variable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import triton                      # first, and without TRITON_INTERPRET: the trap
    import triton.language as tl
    assert "TRITON_INTERPRET" not in os.environ

    @triton.jit
    def softsign_tl(x, alpha):
        return alpha * x / (1.0 + tl.abs(x))

    import opgraph as og
    from opgraph.engines import get_engine
    from opgraph.core.device import CPU

    assert get_engine("triton").available(CPU).ok, get_engine("triton").available(CPU).reason
    og.register_custom_op("softsign", num_inputs=1, reference=lambda x, alpha: alpha * x / (1 + np.abs(x)),
                          triton=softsign_tl, pointwise=True)
    rng = np.random.default_rng(0)

    def check(g, feeds):
        final = g.final
        plan = g.build(device="cpu", engines=["triton"])
        assert {s.config.engine for s in plan.steps} == {"triton"}, plan.describe()
        ref = g.build(device="cpu", engines=["reference"])
        pack, want = dict(feeds), dict(feeds)
        for u in final.outputs:
            t = final.tensors[u]
            pack[u] = np.full(t.dim, np.nan, np.float32)
            want[u] = np.full(t.dim, np.nan, np.float32)
        plan.execute(pack)
        ref.execute(want)
        for u in final.outputs:
            np.testing.assert_allclose(pack[u], want[u], rtol=1e-4, atol=1e-5)
        print("ok", g.name, [s.config.knob("template") for s in plan.steps])

    g = og.Graph("sigmoid_custom", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 16], name="x")
    g.custom("softsign", g.sigmoid(x), params={"alpha": 2.0}).set_output(True).set_name("y")
    check(g, {"x": rng.standard_normal((4, 16)).astype(np.float32)})

    g = og.Graph("row_sum", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[8, 32], name="x")
    g.reduction(g.exp(x), mode="ADD").set_dim([8, 1]).set_output(True).set_name("s")
    check(g, {"x": rng.standard_normal((8, 32)).astype(np.float32)})

    g = og.Graph("mm_gelu", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[1, 16, 32], name="a")
    b = g.tensor(dim=[1, 32, 16], name="b")
    g.gelu(g.matmul(a, b)).set_output(True).set_name("c")
    check(g, {"a": rng.standard_normal((1, 16, 32)).astype(np.float32),
              "b": rng.standard_normal((1, 32, 16)).astype(np.float32)})
    assert "TRITON_INTERPRET" not in os.environ, "opgraph changed the process environment"
    print("all ok")
""")


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU case, also on a GPU machine
    return env


def test_cpu_kernels_run_after_triton_was_imported_without_the_interpreter(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=_child_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "all ok" in done.stdout


def test_engines_command_tells_the_truth_after_triton_was_imported(tmp_path):
    code = (
        "import triton, sys\nfrom opgraph.tools.cli import main\n"
        "sys.argv = ['opgraph', 'engines', '--device', 'cpu']\nmain()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if "triton" in line)
    assert "yes" in row, done.stdout


def test_a_jit_function_called_outside_a_kernel_still_raises_as_triton_says():
    import triton

    from opgraph.engines.triton.interpret import _install

    _install()

    @triton.jit
    def f(x):
        return x

    if not isinstance(f, triton.runtime.jit.JITFunction):
        pytest.skip("Triton is in interpreter mode in this process")
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        f(1)


GPU_CHILD = textwrap.dedent("""
    import numpy as np
    import torch
    import triton                              # imported first, without TRITON_INTERPRET
    import opgraph as og

    g = og.Graph("both", io_data_type=og.DataType.FLOAT)
    a = g.tensor(dim=[1, 64, 128], name="a")
    b = g.tensor(dim=[1, 128, 32], name="b")
    g.reduction(g.sigmoid(g.matmul(a, b)), mode="ADD").set_dim([1, 64, 1]).set_output(True).set_name("s")
    for device in ("cuda", "cpu", "cuda"):     # one process, both kinds of kernel, in turn
        plan = og.Graph.from_json(g.to_json()).build(device=device, engines=["triton"])
        assert {s.config.engine for s in plan.steps} == {"triton"}, plan.describe()
        # an fp32 matmul runs as TF32 on the GPU (noted down_convert_inputs): its tolerance
        tol = 2e-3 if device == "cuda" else None
        bad = og.testing.check_plan(plan, np.random.default_rng(0), rtol=tol, atol=tol)
        assert not bad, (device, bad)
        print("ok", device, [s.config.knob("template") for s in plan.steps])
    print("all ok")
""")


@pytest.mark.gpu
def test_cpu_and_gpu_kernels_in_one_process(tmp_path):
    """The interpreter is decided per kernel: the same process compiles GPU kernels and interprets CPU
    ones, in any order."""
    script = tmp_path / "child.py"
    script.write_text(GPU_CHILD)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("ok ") == 3 and "all ok" in done.stdout


def test_the_engine_says_when_the_variable_blocks_the_gpu(monkeypatch):
    """With TRITON_INTERPRET=1 before Triton's import, Triton cannot compile for a GPU in that process:
    the engine says so instead of failing later."""
    from opgraph.core.device import Device
    from opgraph.engines.triton import interpret, TritonEngine

    monkeypatch.setattr(interpret, "triton_imported_interpreting", lambda: True)
    import opgraph.engines.triton as tri

    monkeypatch.setattr(tri, "triton_imported_interpreting", lambda: True)
    verdict = TritonEngine().available(Device("cuda", 0, "test GPU", (9, 0), 132))
    assert not verdict.ok and "TRITON_INTERPRET" in verdict.reason
