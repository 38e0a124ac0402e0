"""The `opgraph` command: demo, check, run, engines."""

from __future__ import annotations

import json

from click.testing import CliRunner

import opgraph as og
from opgraph.tools.cli import main


def _graph_file(tmp_path, ok=True):
    g = og.Graph("cli", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[3, 4], name="x")
    b = g.tensor(dim=[1, 4], name="b")
    g.relu(g.add(x, b)).set_output(True).set_name("y")
    text = g.to_json()
    if not ok:
        doc = json.loads(text)
        doc["tensors"][1]["dim"] = [1, 5]  # no longer broadcasts
        text = json.dumps(doc)
    path = tmp_path / ("good.json" if ok else "bad.json")
    path.write_text(text)
    return path


def test_demo_runs_and_checks_against_the_reference():
    result = CliRunner().invoke(main, ["demo", "--device", "cpu", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "conv_bias_relu" in result.output and "batchnorm_relu" in result.output
    assert result.output.count("matches the reference") == 2


def test_check_valid_and_invalid(tmp_path):
    ok = CliRunner().invoke(main, ["check", str(_graph_file(tmp_path))])
    assert ok.exit_code == 0 and "valid" in ok.output
    bad = CliRunner().invoke(main, ["check", str(_graph_file(tmp_path, ok=False))])
    assert bad.exit_code == 1
    assert "ShapeError" in bad.output and "broadcast" in bad.output and "'b'" in bad.output


def test_check_rejects_non_graph_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1 and "SerializationError" in result.output


def test_run_verifies_against_the_reference(tmp_path):
    result = CliRunner().invoke(main, ["run", str(_graph_file(tmp_path)), "--device", "cpu", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "matches the reference" in result.output


def test_run_with_the_triton_engine_in_the_interpreter(tmp_path):
    from ..helpers import interpreter_available

    if not interpreter_available():
        import pytest

        pytest.skip("needs Triton's interpreter")
    result = CliRunner().invoke(
        main, ["run", str(_graph_file(tmp_path)), "--device", "cpu", "--engine", "triton", "--repeat", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "triton" in result.output and "matches the reference" in result.output


def test_engines_lists_reference():
    result = CliRunner().invoke(main, ["engines", "--device", "cpu"])
    assert result.exit_code == 0 and "reference" in result.output


def test_explain_prints_the_plan_and_writes_dot(tmp_path):
    dot = tmp_path / "plan.dot"
    result = CliRunner().invoke(main, ["explain", str(_graph_file(tmp_path)), "--device", "cpu", "--dot", str(dot)])
    assert result.exit_code == 0, result.output
    assert "step 0" in result.output and "reference" in result.output
    text = dot.read_text()
    assert text.startswith("digraph") and "cluster_0" in text and "RELU_FWD" in text and "y %" in text


def test_explain_svg(tmp_path):
    import shutil

    import pytest

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot program is not installed")
    svg = tmp_path / "plan.svg"
    result = CliRunner().invoke(main, ["explain", str(_graph_file(tmp_path)), "--device", "cpu", "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_explain_svg_without_graphviz_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` program (or no graphviz package): one line, exit 1
    svg = tmp_path / "plan.svg"
    result = CliRunner().invoke(main, ["explain", str(_graph_file(tmp_path)), "--device", "cpu", "--svg", str(svg)])
    assert result.exit_code == 1, result.output
    assert "could not draw SVG" in result.output and "Traceback" not in result.output
    assert not svg.exists()


# -- issue 20: what the CLI shows a newcomer --------------------------------------------------------


def _mlp_file(tmp_path, hidden=256, ffn=1024):
    """layernorm -> matmul -> gelu -> matmul in fp32: unscaled random weights made its outputs
    reach ~600 and `run` reported a mismatch on a correct engine."""
    g = og.Graph("mlp", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[64, hidden], name="x")
    s = g.tensor(dim=[1, hidden], name="ln_scale")
    b = g.tensor(dim=[1, hidden], name="ln_bias")
    w1 = g.tensor(dim=[hidden, ffn], name="w1")
    w2 = g.tensor(dim=[ffn, hidden], name="w2")
    h = g.layernorm("INFERENCE", x, scale=s, bias=b, epsilon=1e-5)[0]
    g.matmul(g.gelu(g.matmul(h, w1)), w2).set_output(True).set_name("y")
    path = tmp_path / "mlp.json"
    path.write_text(g.to_json())
    return path


def _no_traceback(result):
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "Traceback" not in text and result.exception is None or isinstance(result.exception, SystemExit), text


def test_run_checks_relative_to_the_outputs_scale_with_initialised_weights(tmp_path):
    result = CliRunner().invoke(
        main, ["run", str(_mlp_file(tmp_path)), "--device", "cpu", "--engine", "torch", "--repeat", "1"]
    )
    assert result.exit_code == 0, result.output
    assert "matches the reference" in result.output and "largest |output|" in result.output


def test_run_still_catches_a_wrong_engine(tmp_path, custom_ops_restored):
    mod = tmp_path / "wrong_ops.py"
    mod.write_text(
        "import numpy as np\nimport opgraph as og\n"
        "og.register_custom_op('twice', num_inputs=1, reference=lambda x: 2 * x,\n"
        "                      torch=lambda x: 2.001 * x, pointwise=True)\n"
    )
    g = og.Graph("custom", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    og.register_custom_op("twice", num_inputs=1, reference=lambda x: 2 * x, pointwise=True)
    g.custom("twice", x).set_output(True).set_name("y")
    path = tmp_path / "custom.json"
    path.write_text(g.to_json())
    og.ops.custom.CUSTOM_OPS.pop("twice")
    missing = CliRunner().invoke(main, ["check", str(path)])
    assert missing.exit_code == 1 and "twice" in missing.output
    result = CliRunner().invoke(
        main, ["run", str(path), "--device", "cpu", "--engine", "torch", "--repeat", "1", "--import", str(mod)]
    )
    assert result.exit_code == 1, result.output
    assert "DOES NOT match the reference" in result.output and "mismatch" in result.output


def test_import_of_a_missing_module_is_one_error(tmp_path):
    result = CliRunner().invoke(main, ["check", str(_graph_file(tmp_path)), "--import", "no_such_module_xyz"])
    assert result.exit_code == 1
    assert "no_such_module_xyz" in result.output and "[rule cli.import]" in result.output
    _no_traceback(result)


def test_explain_shows_the_knobs_and_the_main_not_fused_reason_first(tmp_path):
    from ..helpers import interpreter_available

    import pytest

    if not interpreter_available():
        pytest.skip("needs Triton's interpreter")
    result = CliRunner().invoke(
        main, ["explain", str(_mlp_file(tmp_path, 32, 64)), "--device", "cpu", "--engine", "triton"]
    )
    assert result.exit_code == 0, result.output
    assert "triton[template=rownorm" in result.output and "triton[template=matmul" in result.output
    cuts = [line for line in result.output.splitlines() if "not fused" in line]
    assert cuts, result.output
    # the matmul template's reason leads, the templates for absent ops are only named
    first = cuts[0].split("triton: ", 1)[1]
    assert first.startswith("matmul: layernorm"), cuts[0]
    reasons = cuts[0].split("not applicable (no op of theirs here)", 1)[0]  # (then one name a template)
    assert "the piece has no conv_fprop" not in cuts[0] and len(reasons) < 400, cuts[0]


def test_errors_keep_their_rule_and_brackets(tmp_path):
    bad = CliRunner().invoke(main, ["check", str(_graph_file(tmp_path, ok=False))])
    assert bad.exit_code == 1
    assert "[rule " in bad.output, bad.output


def test_engines_shows_pip_extras_in_brackets(monkeypatch):
    import opgraph.engines.triton as tri

    monkeypatch.setattr(tri, "_triton_installed", lambda: False)
    result = CliRunner().invoke(main, ["engines", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "opgraph[triton,torch]" in result.output.replace("\n", "").replace("│", "").replace(" ", ""), result.output


def test_user_mistakes_are_one_line_errors_without_tracebacks(tmp_path):
    from opgraph.core.device import cuda_usable

    path = str(_graph_file(tmp_path))
    for args in (["run", path, "--repeat", "0"], ["run", path, "--seed", "-1"], ["demo", "--repeat", "0"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "Invalid value" in result.output, (args, result.output)
        _no_traceback(result)
    if not cuda_usable():
        for args in (
            ["run", path, "--device", "cuda"],
            ["engines", "--device", "cuda"],
            ["explain", path, "--device", "cuda:0"],
        ):
            result = CliRunner().invoke(main, args)
            assert result.exit_code == 1, (args, result.output)
            assert "no CUDA GPU is usable here [rule device.unavailable]" in result.output
            _no_traceback(result)
    result = CliRunner().invoke(main, ["run", path, "--device", "tpu"])
    assert result.exit_code == 1 and "unknown device" in result.output
    _no_traceback(result)


def test_check_lists_every_schema_problem_at_once_with_suggestions(tmp_path):
    doc = json.loads(_graph_file(tmp_path).read_text())
    doc["tensors"][0]["dims"] = doc["tensors"][0].pop("dim")
    doc["ops"][0]["attrs"]["mode"] = "ADDITION"
    doc["ops"][1]["op"] = "pointwse"
    path = tmp_path / "typos.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 1
    out = result.output
    assert "3 place(s)" in out, out
    assert "did you mean 'dim'" in out and "did you mean 'pointwise'" in out and "'ADDITION'" in out
    _no_traceback(result)


def test_a_hand_written_file_needs_only_what_the_python_api_needs(tmp_path):
    doc = {
        "format": "opgraph.graph",
        "version": 1,
        "io_data_type": "FLOAT",
        "tensors": [{"uid": 1, "name": "x", "dim": [2, 3]}, {"uid": 2, "name": "y"}],
        "ops": [{"op": "pointwise", "attrs": {"mode": "RELU_FWD"}, "inputs": {"input0": 1}, "outputs": {"output": 2}}],
    }
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["check", str(path)])
    assert result.exit_code == 0, result.output
    run = CliRunner().invoke(main, ["run", str(path), "--device", "cpu", "--repeat", "1"])
    assert run.exit_code == 0 and "matches the reference" in run.output, run.output


def test_plan_files_are_recognised_by_check_run_and_explain(tmp_path):
    g = og.Graph.from_json(_graph_file(tmp_path).read_text())
    plan = g.build(device="cpu")
    path = tmp_path / "plan.ogp"
    plan.save(path)
    check = CliRunner().invoke(main, ["check", str(path)])
    assert check.exit_code == 0, check.output
    assert "valid plan file" in check.output and "step 0: reference" in check.output
    run = CliRunner().invoke(main, ["run", str(path), "--repeat", "1", "--device", "cpu"])
    assert run.exit_code == 0 and "matches the reference" in run.output, run.output
    explain = CliRunner().invoke(main, ["explain", str(path), "--device", "cpu"])
    assert explain.exit_code == 0 and "step 0: reference" in explain.output, explain.output
    pinned = CliRunner().invoke(main, ["run", str(path), "--engine", "torch"])
    assert pinned.exit_code == 1 and "[rule cli.plan_options]" in pinned.output


def test_cache_info_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True)
    for i in range(3):
        (kernels / f"og_{i:020d}.py").write_text("x = 1\n" * 100)
    (tmp_path / "cache" / "tuning.json").write_text('{"a": {}, "b": {}}')
    info = CliRunner().invoke(main, ["cache", "info"])
    assert info.exit_code == 0, info.output
    assert "3 files" in info.output and "2 entries" in info.output and str(tmp_path / "cache") in info.output
    cleared = CliRunner().invoke(main, ["cache", "clear", "--no-tuning"])
    assert cleared.exit_code == 0 and "removed 3 files" in cleared.output
    assert not list(kernels.iterdir()) and (tmp_path / "cache" / "tuning.json").exists()


def test_python_dash_m_opgraph_and_the_version():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "opgraph", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"opgraph, version {og.__version__}"


def test_on_the_cpu_demo_and_run_check_generated_kernels_against_the_reference(tmp_path, monkeypatch):
    """Issue 38: without a GPU the demo and `opgraph run` built for the reference engine and checked it
    against itself; the generated kernels (Triton's interpreter) run now, beside the reference."""
    import pytest

    from ..helpers import interpreter_available

    if not interpreter_available():
        pytest.skip("needs Triton's interpreter")
    monkeypatch.setenv("OPGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    demo = CliRunner().invoke(main, ["demo", "--device", "cpu", "--repeat", "1"])
    assert demo.exit_code == 0, demo.output
    assert "Triton's interpreter" in demo.output and "step 0: triton[" in demo.output
    assert demo.output.count("matches the reference") == 2
    run = CliRunner().invoke(main, ["run", str(_graph_file(tmp_path)), "--device", "cpu", "--repeat", "1"])
    assert run.exit_code == 0, run.output
    assert "step 0: triton[" in run.output and "matches the reference" in run.output
    ref = CliRunner().invoke(
        main, ["run", str(_graph_file(tmp_path)), "--device", "cpu", "--repeat", "1", "--engine", "reference"]
    )
    assert ref.exit_code == 0 and "step 0: reference" in ref.output
