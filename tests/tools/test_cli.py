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
    result = CliRunner().invoke(main, ["run", str(_graph_file(tmp_path)), "--device", "cpu", "--engine", "triton",
                                       "--repeat", "1"])
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
