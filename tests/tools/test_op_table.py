"""The generated table of where each op is known (opgraph.tools.op_table): complete (every op has a
reference implementation and a torch mapping, and a backward rule or a reason in NOT_DIFFERENTIABLE),
right about ops whose places are known, and committed current in docs/op-table.md."""

from __future__ import annotations

import pytest

from opgraph.core.op import OPS
from opgraph.tools.op_table import PAGE, op_table, problems, render

pytest.importorskip("torch")  # the torch mappings and the importer's translators
pytest.importorskip("triton")  # the templates


@pytest.fixture(scope="module")
def rows():
    return {r.kind: r for r in op_table()}


def test_every_registered_op_has_a_row_and_nothing_is_missing(rows):
    assert set(rows) == set(OPS)
    assert problems(list(rows.values())) == []


def test_the_table_knows_what_the_code_says(rows):
    mm = rows["matmul"]
    assert (
        mm.builders == ("matmul", "scaled_matmul", "sdpa_fp8")
        and mm.torch
        and mm.reference
        and mm.library
        and mm.cudnn_engine
    )
    assert "matmul" in mm.triton and {"mm", "bmm", "linear", "addmm"} <= set(mm.aten)
    assert mm.cudnn == ("OPERATION_MATMUL",) and mm.backward == "rule"
    assert rows["resample_max_backward"].triton == ("pool_backward",)
    assert rows["resample_max_backward"].backward.startswith("none: a backward op")
    assert rows["stop_gradient"].backward == "rule" and rows["stop_gradient"].triton == ("fused elementwise",)
    assert "masked_fill" in rows["pointwise"].aten and "where" in rows["pointwise"].aten
    assert rows["pointwise"].cudnn == ("OPERATION_POINTWISE",)
    assert rows["conv_fprop"].cudnn == ("OPERATION_CONVOLUTION_FORWARD",)


def test_a_missing_mapping_or_rule_is_reported(rows, monkeypatch):
    from dataclasses import replace

    bad = [replace(rows["matmul"], torch=False), replace(rows["slice"], backward="")]
    found = problems(bad)
    assert any("matmul: no torch mapping" in p for p in found) and any("slice: no backward rule" in p for p in found)


def test_the_committed_page_is_current(rows):
    want = render(op_table())
    assert PAGE.read_text() == want, "docs/op-table.md is stale: run python -m opgraph.tools.op_table --write"
