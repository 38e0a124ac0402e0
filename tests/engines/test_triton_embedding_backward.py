"""The embedding backward template (templates/embedding_backward.py: the table's gradient zeroed, then the
gradient rows scatter-added by index) against the reference engine under Triton's interpreter: repeated
indices (several tokens adding to one row), out-of-range indices (negative, past the table, past int32)
adding nothing, padding_idx's row left zero, every index type, indices of rank 1-3, a gradient read
through strides; every candidate of the GPU and CPU heuristics. Marked gpu: a language model's sizes
against PyTorch in float64."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.build.planner import Step
from opgraph.core.config import EngineConfig, NumericalNote
from opgraph.core.device import Device
from opgraph.core.tensor import packed_strides
from opgraph.engines import get_engine
from opgraph.engines.triton.templates import embedding_backward as template
from opgraph.runtime.plan import ExecutionPlan
from opgraph.testing import check_plan

from ..helpers import requires_cuda, requires_interpreter

DT = og.DataType
H100 = Device("cuda", 0, "H100", (9, 0), 132)
CPU = Device("cpu")
V, D = 11, 19


def _graph(idx_dims, *, index_type=DT.INT64, grad_type=DT.FLOAT, padding_idx=-1, transposed=False):
    g = og.Graph("embedding_backward", io_data_type=DT.FLOAT)
    idx = g.tensor(dim=idx_dims, name="idx", data_type=index_type)
    dims = [*idx_dims, D]
    # transposed: the embedding axis outermost in memory (a gradient made [D, ...] and read transposed)
    stride = [*packed_strides(idx_dims), int(np.prod(idx_dims))] if transposed else packed_strides(dims)
    dy = g.tensor(dim=dims, stride=stride, name="dy", data_type=grad_type)
    g.embedding_backward(dy, idx, num_weights=V, padding_idx=padding_idx, name="dembedding").set_output(
        True
    ).set_data_type(DT.FLOAT)
    return g, idx


def _indices(idx, index_type, rng):
    """Indices with repeats (a few rows named many times), out of range (negative, V, past int32 for INT64,
    which would wrap to a row in range if narrowed before its range is checked) and the padding row."""

    def prepare(pack):
        values = rng.integers(0, 4, size=idx.dim)  # (rows 0-3: each named by several tokens)
        flat = values.reshape(-1)
        flat[: min(4, flat.size)] = [-1, V, 2, V + 5][: min(4, flat.size)]
        if index_type is DT.INT64 and flat.size > 4:
            flat[4] = 2 + 2**32
        if index_type is DT.UINT8:
            values = np.abs(values)
        pack[idx.uid][...] = values.astype(pack[idx.uid].dtype)

    return prepare


def every_candidate(g, idx, index_type, rng):
    plan = g.build(device="cpu", engines=["triton"])
    assert [s.config.knob("template") for s in plan.steps] == ["embedding_backward"], plan.describe()
    assert NumericalNote.NONDETERMINISTIC in plan.steps[0].config.numerical_notes
    piece = plan.steps[0].piece
    seen = []
    for device in (H100, CPU):
        for k in template.TEMPLATE.candidates(piece, device):
            if k in seen:
                continue
            seen.append(k)
            cfg = EngineConfig("triton", (("template", "embedding_backward"), *sorted(k.items())))
            kernel = get_engine("triton").compile(piece, cfg, plan.device)
            one = ExecutionPlan(plan.graph, plan.device, (Step(0, piece, cfg, kernel),), ())
            bad = check_plan(one, rng, prepare=_indices(idx, index_type, rng))
            assert not bad, f"{k}: " + "\n".join(map(str, bad))
    return seen


@pytest.mark.parametrize("idx_dims", [[13], [2, 7], [2, 1, 5]], ids=str)
@requires_interpreter
def test_rows_named_by_several_tokens_sum_and_out_of_range_ones_add_nothing(idx_dims, rng):
    g, idx = _graph(idx_dims)
    seen = every_candidate(g, idx, DT.INT64, rng)
    # (the interpreter's candidates take several programs along both axes: 19 columns in blocks of 16 and 8)
    assert any(-(-D // k["BLOCK"]) > 1 for k in seen)


@pytest.mark.parametrize("index_type", [DT.INT32, DT.INT8, DT.UINT8], ids=lambda d: d.name)
@pytest.mark.parametrize("grad_type", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@requires_interpreter
def test_index_and_gradient_types(index_type, grad_type, rng):
    g, idx = _graph([3, 6], index_type=index_type, grad_type=grad_type)
    every_candidate(g, idx, index_type, rng)


@requires_interpreter
def test_the_padding_row_stays_zero_and_strided_gradients_are_read_in_place(rng):
    g, idx = _graph([4, 5], padding_idx=2, transposed=True)
    every_candidate(g, idx, DT.INT64, rng)


def test_a_table_gradient_of_another_type_is_left_to_other_engines():
    g, _ = _graph([4, 5])
    g.final  # noqa: B018  (validated)
    g2 = og.Graph("bf16_table", io_data_type=DT.FLOAT)
    idx = g2.tensor(dim=[4], name="idx", data_type=DT.INT64)
    dy = g2.tensor(dim=[4, D], name="dy")
    g2.embedding_backward(dy, idx, num_weights=V).set_output(True).set_data_type(DT.BFLOAT16)
    from opgraph.core.piece import make_piece

    why = template.TEMPLATE.match(make_piece(g2.final, 0, g2.final.nodes), H100)
    assert not why.ok and "fp32 by atomics" in why.reason


def test_a_llama_training_step_has_no_torch_engine_step(monkeypatch):
    """The embedding's backward was the Llama training plan's one torch-engine step (issue 40: none in these
    plans): planned for an H200's engines on the CPU, it is this template's."""
    from opgraph.build.planner import engine_configs
    from opgraph.core.config import HeurMode, Support

    for name in ("triton", "torch"):  # (as on a GPU machine: the policy golden's stand-ins)
        monkeypatch.setattr(type(get_engine(name)), "available", lambda self, device: Support.yes())
    g = og.Graph("lm_input", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    idx = g.tensor(dim=[2, 8], name="ids", data_type=DT.INT64)
    dy = g.tensor(dim=[2, 8, 32], name="dy")
    g.embedding_backward(dy, idx, num_weights=64, name="dembedding").set_output(True).set_data_type(DT.FLOAT)
    (found,) = engine_configs(g.final, device=H100, engines=["triton", "torch"], heur_mode=HeurMode.A)
    assert found.configs[0].engine == "triton" and found.configs[0].knob("template") == "embedding_backward"


@pytest.mark.gpu
@requires_cuda
def test_gpu_a_language_models_embedding_gradient():
    """Batch 4 x 1024 tokens of a 32000-row table, D 1024, bf16 gradient: against PyTorch's index_add_ in
    float64 (fp32 atomics: the order of each row's additions varies, within fp32's rounding of the sums)."""
    import torch

    torch.manual_seed(0)
    g = og.Graph("lm_input", io_data_type=DT.BFLOAT16)
    idx = g.tensor(dim=[4, 1024], name="ids", data_type=DT.INT64)
    dy = g.tensor(dim=[4, 1024, 1024], name="dy")
    out = g.embedding_backward(dy, idx, num_weights=32000).set_output(True).set_data_type(DT.FLOAT)
    plan = g.build(engines=["triton"])
    assert [s.config.knob("template") for s in plan.steps] == ["embedding_backward"], plan.describe()
    ids = torch.randint(0, 512, (4, 1024), device="cuda")  # (many repeats)
    grad = torch.randn(4, 1024, 1024, device="cuda", dtype=torch.bfloat16)
    dw = torch.full((32000, 1024), float("nan"), device="cuda")
    plan.execute({idx.uid: ids, dy.uid: grad, out.uid: dw})
    want = torch.zeros(32000, 1024, dtype=torch.float64, device="cuda")
    want.index_add_(0, ids.reshape(-1), grad.reshape(-1, 1024).double())
    torch.testing.assert_close(dw.double(), want, rtol=1e-5, atol=1e-4)


def _language_model(grad_type=DT.BFLOAT16):
    g = og.Graph("lm_input", io_data_type=grad_type)
    idx = g.tensor(dim=[4, 1024], name="ids", data_type=DT.INT64)
    dy = g.tensor(dim=[4, 1024, 1024], name="dy")
    g.embedding_backward(dy, idx, num_weights=32000).set_output(True).set_data_type(DT.FLOAT)
    return g


HOPPER_CASES = {"lm": (_language_model, "embedding_backward", 2)}


def test_kernels_compile_for_hopper():
    """sm_90a, the installed Triton: both launches of the two GPU candidates compile, with no spills."""
    from .hopper_compile import compile_for_hopper

    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert sorted({line.split()[2] for line in lines}) == ["kernel_scatter", "kernel_zero"], lines
    assert len(lines) == 4 and all(" spills 0 " in line for line in lines), lines
