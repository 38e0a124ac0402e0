"""The Triton reduction template against the reference engine: under the interpreter on the CPU
(small shapes) and, marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.engines import get_engine
from opgraph.core.config import EngineConfig
from opgraph.engines.triton.templates.reduction import MAX_TILE, TEMPLATE, analyze
from opgraph.ops.reduction import ReductionMode
from opgraph.core.piece import make_piece
from opgraph.tools.samples import nhwc
from opgraph.testing import compare, random_pack, reference_outputs

from ..helpers import assert_engine_matches, requires_cuda, requires_interpreter, run_at_shape
from .hopper_compile import compile_for_hopper

pytestmark = pytest.mark.interpreter
DT = og.DataType
R = ReductionMode
H100 = Device("cuda", 0, "H100", (9, 0), 132)


def _graph(mode, dims, out, *, dt=DT.FLOAT, layout="nchw", out_type=None):
    g = og.Graph("red", io_data_type=dt)
    x = g.tensor(dim=list(dims), stride=nhwc(list(dims)) if layout == "nhwc" else None, name="x")
    y = g.reduction(x, mode, name="red").set_dim(list(out)).set_output(True).set_name("y")
    if out_type is not None:
        y.set_data_type(out_type)
    return g


def _zeros(pack):
    """Exact zeros in every third element of the inputs (MUL_NO_ZEROS must skip them); outputs, all
    poison, are left alone."""
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.size > 2 and not np.isnan(v.astype(np.float64)).all():
            v[np.unravel_index(np.arange(0, v.size, 3), v.shape)] = 0


def _nans(pack):
    """A NaN in a few rows/columns of every input (MIN/MAX/AMAX must propagate it)."""
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.size > 4 and v.dtype.kind == "f":
            idx = np.unravel_index([1, v.size // 2], v.shape)
            v[idx] = np.nan


CASES = {  # name: (input dims, output dims)
    "row": ((5, 37), (5, 1)),
    "column": ((37, 6), (1, 6)),
    "full": ((4, 9, 5), (1, 1, 1)),
    "middle": ((3, 7, 5), (3, 1, 5)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", list(R), ids=lambda m: m.name)
def test_every_mode(mode, case, rng):
    dims, out = CASES[case]
    prepare = _zeros if mode is R.MUL_NO_ZEROS else None
    assert_engine_matches(_graph(mode, dims, out), rng, expect_steps=1, prepare=prepare)


AXES = {  # reduced axes of [N, C, H, W] -> output dims
    "per_channel": (1, 5, 1, 1),
    "spatial": (2, 5, 1, 1),
    "channel": (2, 1, 3, 4),
    "full": (1, 1, 1, 1),
    "height": (2, 5, 1, 4),
    "batch": (1, 5, 3, 4),
    "none": (2, 5, 3, 4),
}


@pytest.mark.parametrize("mode", [R.ADD, R.MAX, R.AVG])
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_axes_and_layouts(layout, axes, mode, rng):
    g = _graph(mode, (2, 5, 3, 4), AXES[axes], dt=DT.HALF, layout=layout)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("mode", [R.ADD, R.AMAX, R.NORM2, R.MIN])
@pytest.mark.parametrize("case", ["row", "column"])
def test_input_types(case, mode, dt, rng):
    dims, out = CASES[case]
    assert_engine_matches(_graph(mode, dims, out, dt=dt), rng, expect_steps=1)


@pytest.mark.parametrize("out_type", [DT.HALF, DT.BFLOAT16, DT.INT32])
def test_output_types(out_type, rng):
    g = _graph(R.ADD, (6, 20), (6, 1), out_type=out_type)
    assert_engine_matches(g, rng, expect_steps=1, integers=True, low=-4, high=4)


@pytest.mark.parametrize("mode", [R.MIN, R.MAX, R.AMAX])
@pytest.mark.parametrize("case", ["row", "column", "full"])
def test_nan_propagates(case, mode, rng):
    dims, out = CASES[case]
    assert_engine_matches(_graph(mode, dims, out), rng, expect_steps=1, prepare=_nans)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_prologue_dag_two_reductions_and_a_full_output_in_one_kernel(layout, rng):
    """t = relu(x*s + b) stored full-size, sum of t and max of x*x per channel of an image."""
    dims = [2, 8, 5, 6]
    g = og.Graph("pro", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims) if layout == "nhwc" else None, name="x")
    s = g.tensor(dim=[1], data_type=DT.FLOAT, is_pass_by_value=True, name="s")
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    t = g.relu(g.bias(g.mul(x, s), b)).set_output(True).set_name("t")
    g.reduction(t, R.ADD).set_dim([1, 8, 1, 1]).set_output(True).set_name("sum")
    g.reduction(g.mul(x, x), R.MAX).set_dim([1, 8, 1, 1]).set_output(True).set_name("max")
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "reduction"


@pytest.mark.parametrize("split", [1, 2])
def test_genstats_and_a_reduction_of_another_input(split, monkeypatch, rng):
    """genstats of relu(x) and the max of z (an input nothing else reads) per channel, one kernel."""
    _force(monkeypatch, BLOCK_M=4, BLOCK_K=8, SPLIT=split, num_warps=4)
    dims = [2, 4, 3, 5]
    g = og.Graph("mix", io_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    z = g.tensor(dim=dims, stride=nhwc(dims), name="z")
    s, sq = g.genstats(g.relu(x))
    s.set_output(True)
    sq.set_output(True)
    g.reduction(z, R.AMAX).set_dim([1, 4, 1, 1]).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_genstats_nhwc_with_prologue(dt, rng):
    dims = [3, 16, 5, 7]
    g = og.Graph("gs", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    sc = g.tensor(dim=[1, 16, 1, 1], stride=nhwc([1, 16, 1, 1]), name="scale")
    s, sq = g.genstats(g.relu(g.mul(x, sc)), name="stats")
    s.set_output(True).set_name("sum")
    sq.set_output(True).set_name("sq_sum")
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert analyze(plan.steps[0].piece).k_fast is False  # channels contiguous: columns


def test_reduction_result_ends_the_piece(rng):
    """sum(x) / K as a later op: the reduction and the division are two steps, both Triton."""
    g = og.Graph("mean", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 10], name="x")
    s = g.reduction(x, R.ADD).set_dim([4, 1])
    g.mul(s, 0.1).set_output(True).set_name("mean")
    plan = assert_engine_matches(g, rng, expect_steps=2)
    assert [st.config.knob("template") for st in plan.steps] == ["reduction", "pointwise"]
    assert "reads a reduction's result" in plan.describe()


def test_reductions_of_different_axes_are_separate_steps(rng):
    g = og.Graph("two", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 10], name="x")
    g.reduction(x, R.ADD).set_dim([4, 1]).set_output(True)
    g.reduction(x, R.ADD).set_dim([1, 10]).set_output(True)
    assert_engine_matches(g, rng, expect_steps=2)


# -- the split path: partials in scratch, a second launch combines them ---------------------------


def _force(monkeypatch, **knobs):
    from opgraph.engines.triton.knobs import ReductionKnobs
    from opgraph.engines.triton.templates.reduction import ReductionMatch

    monkeypatch.setattr(ReductionMatch, "candidates", lambda self: [ReductionKnobs(**knobs)])


@pytest.mark.parametrize("mode", list(R), ids=lambda m: m.name)
def test_split_every_mode(mode, monkeypatch, rng):
    _force(monkeypatch, BLOCK_M=2, BLOCK_K=8, SPLIT=3, num_warps=4)
    prepare = _zeros if mode is R.MUL_NO_ZEROS else (_nans if mode in (R.MIN, R.MAX) else None)
    plan = assert_engine_matches(_graph(mode, (5, 45), (5, 1)), rng, expect_steps=1, prepare=prepare)
    kernel = plan.steps[0].kernel
    assert len(kernel.generated.launches) == 2 and kernel.scratch_bytes > 0


@pytest.mark.parametrize("split", [2, 5, 64])
def test_split_genstats_nhwc_columns(split, monkeypatch, rng):
    _force(monkeypatch, BLOCK_M=4, BLOCK_K=4, SPLIT=split, num_warps=4)
    dims = [2, 6, 5, 3]
    g = og.Graph("gs", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    s, sq = g.genstats(g.relu(x))
    s.set_output(True)
    sq.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    launches = plan.steps[0].kernel.generated.launches
    assert 1 < launches[0].grid[1] <= min(split, 8)  # 30 rows in chunks of whole 4-row tiles


def test_split_full_reduction_with_full_output(monkeypatch, rng):
    _force(monkeypatch, BLOCK_M=1, BLOCK_K=16, SPLIT=4, num_warps=4)
    g = og.Graph("full", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 50], name="x")
    t = g.exp(x).set_output(True).set_name("t")
    g.reduction(t, R.AVG).set_dim([1, 1]).set_output(True)
    g.reduction(t, R.NORM1).set_dim([1, 1]).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


# -- the template directly -----------------------------------------------------------------------


def _run_whole(g, rng, knobs, **kw):
    """Compile the whole graph as one reduction piece (no partitioner) and compare its outputs."""
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    cfg = EngineConfig("triton", (("template", "reduction"), *sorted(knobs.items())))
    kernel = get_engine("triton").compile(piece, cfg, Device("cpu"))
    pack = random_pack(final, rng, **kw)
    want = reference_outputs(final, pack)
    kernel.run(pack, None, np.empty(max(kernel.scratch_bytes, 1), np.uint8))
    bad = [m for u in final.outputs if (m := compare(final.tensors[u], pack[u], want[u])) is not None]
    assert not bad, "\n".join(map(str, bad)) + "\n" + kernel.source()
    return kernel


@pytest.mark.parametrize("split", [1, 3])
def test_broadcast_smaller_output_written_once(split, rng):
    """A per-channel value computed in the piece and needed outside is stored by one lane each."""
    g = og.Graph("bc", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 6, 5], name="x")
    b = g.tensor(dim=[1, 6, 1], name="b")
    t = g.mul(x, 2.0)
    c = g.add(b, 1.0).set_output(True).set_name("c")
    g.reduction(g.mul(t, c), R.ADD).set_dim([4, 1, 1]).set_output(True)
    _run_whole(g, rng, {"BLOCK_M": 2, "BLOCK_K": 8, "SPLIT": split, "num_warps": 2})


def test_gen_index_in_the_prologue(rng):
    g = og.Graph("gi", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 7], name="x")
    i = g.gen_index(x, axis=1).set_data_type(DT.FLOAT)
    g.reduction(g.mul(x, i), R.ADD).set_dim([3, 1]).set_output(True)
    g.reduction(g.gen_index(x, axis=0).set_data_type(DT.FLOAT), R.MAX).set_dim([1, 7]).set_output(True)
    # the two reductions reduce different axes: check each piece kind runs
    assert_engine_matches(g, rng, expect_steps=2)


def _cross_entropy_rows(dt=DT.BFLOAT16, rows=5, classes=37):
    """A cross-entropy's row pass: sum(exp(x - max)) and the target's logit picked by a one-hot of
    gen_index (INT32) == target (INT64)."""
    g = og.Graph("ce", io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[rows, classes], name="x")
    m = g.tensor(dim=[rows, 1], name="m", data_type=DT.FLOAT)
    t = g.tensor(dim=[rows, 1], name="t", data_type=DT.INT64)
    shifted = g.sub(x, m).set_data_type(DT.FLOAT)
    g.reduction(g.exp(shifted).set_data_type(DT.FLOAT), R.ADD).set_dim([rows, 1]).set_output(True).set_name("s")
    onehot = g.cmp_eq(g.gen_index(x, axis=1).set_data_type(DT.INT32), t).set_data_type(DT.FLOAT)
    picked = g.mul(onehot, g.sub(x, m).set_data_type(DT.FLOAT)).set_data_type(DT.FLOAT)
    g.reduction(picked, R.ADD).set_dim([rows, 1]).set_output(True).set_name("picked")
    return g


def _targets_in_range(classes):
    def prepare(pack):
        for v in pack.values():
            if isinstance(v, np.ndarray) and v.dtype == np.int64:
                v[...] = np.arange(v.size).reshape(v.shape) * 7 % classes

    return prepare


def test_integer_ops_keep_the_float_math_fp32(rng):
    """INT32/INT64 values compute in fp64 (exact), the rest of the piece in fp32: an INT64 target
    beside 50k logits must not make their exp and sums fp64 (4x slower on an H100), and the one-hot
    compares integers as integers."""
    g = _cross_entropy_rows()
    assert_engine_matches(g, rng, expect_steps=1, prepare=_targets_in_range(37))
    source = TEMPLATE.generate(_piece(g), TEMPLATE.candidates(_piece(g), H100)[0], H100).source
    body = source[source.index("def kernel(") :]
    assert "tl.float64" not in body, body
    assert "tl.exp(" in body and ".to(tl.int64) ==" in body, body


def test_declines_with_reasons():
    from opgraph.engines.triton.templates.reduction import TEMPLATE as T

    g = og.Graph("no", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 10], name="x")
    g.relu(x).set_output(True)
    final = g.final
    verdict = T.match(make_piece(final, 0, final.nodes), Device("cpu"))
    assert not verdict and "no reduction" in verdict.reason


# -- the heuristic, for the GPU (pure Python) ------------------------------------------------------


def _piece(g):
    final = g.final
    return make_piece(final, 0, final.nodes)


def test_heuristic_per_channel_stats_of_nhwc_split_k_over_columns():
    dims = [32, 256, 56, 56]
    g = og.Graph("gs", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    s, sq = g.genstats(x)
    s.set_output(True)
    sq.set_output(True)
    p = _piece(g)
    first = TEMPLATE.candidates(p, H100)[0]
    assert not analyze(p).k_fast  # C contiguous: the tile's fast axis is M
    m_blocks = -(-256 // first["BLOCK_M"])
    assert m_blocks * first["SPLIT"] >= 3 * H100.sm_count  # enough programs to fill the GPU
    gen = TEMPLATE.generate(p, first, H100)
    chunks = gen.launches[0].grid[1]
    assert len(gen.launches) == 2 and chunks > 1 and gen.scratch_bytes >= 2 * chunks * 256 * 4


def test_heuristic_row_reduction_no_split():
    g = og.Graph("row", io_data_type=DT.BFLOAT16)
    x = g.tensor(dim=[8192, 4096], name="x")
    g.reduction(x, R.ADD).set_dim([8192, 1]).set_output(True)
    p = _piece(g)
    cands = TEMPLATE.candidates(p, H100)
    assert analyze(p).k_fast and cands[0]["SPLIT"] == 1 and cands[0]["BLOCK_K"] >= 1024
    for c in cands:
        assert c["BLOCK_M"] * c["BLOCK_K"] <= MAX_TILE
        assert all(c[k] & (c[k] - 1) == 0 for k in ("BLOCK_M", "BLOCK_K"))
    assert len(cands) > 1


def test_heuristic_full_reduction_splits():
    g = og.Graph("full", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[1 << 24], name="x")
    g.reduction(x, R.ADD).set_dim([1]).set_output(True)
    first = TEMPLATE.candidates(_piece(g), H100)[0]
    assert first["SPLIT"] >= 3 * H100.sm_count


# -- compiled for Hopper (no GPU needed: Triton's compiler and ptxas, in a process without the
# interpreter) ---------------------------------------------------------------------------------------


def _genstats_nhwc_prologue():
    dims = [32, 256, 56, 56]
    g = og.Graph("gs", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    b = g.tensor(dim=[1, 256, 1, 1], name="b")
    s = g.tensor(dim=[1], data_type=DT.FLOAT, is_pass_by_value=True, name="s")
    t = g.relu(g.bias(g.mul(x, s), b)).set_output(True)
    a, q = g.genstats(t)
    a.set_output(True)
    q.set_output(True)
    return g


def _row(mode):
    return lambda: _graph(mode, (8192, 4096), (8192, 1), dt=DT.BFLOAT16)


def _full(mode):
    return lambda: _graph(mode, (1 << 22,), (1,), out_type=DT.HALF)


HOPPER_CASES = {
    "genstats_nhwc": (_genstats_nhwc_prologue, "reduction", None),
    "genstats_nchw": (lambda: _graph(R.ADD, (8, 64, 56, 56), (1, 64, 1, 1), dt=DT.HALF), "reduction", None),
    **{f"row_{m.name}": (_row(m), "reduction", None) for m in (R.ADD, R.MAX, R.MUL_NO_ZEROS, R.NORM2)},
    **{f"full_{m.name}": (_full(m), "reduction", None) for m in (R.MUL, R.MIN, R.AVG)},
    "int64_offsets": (lambda: _graph(R.MAX, (40000, 65536), (1, 65536), dt=DT.HALF), "reduction", None),
    "cross_entropy_rows": (lambda: _cross_entropy_rows(rows=8192, classes=50304), "reduction", None),
    "middle_split": (
        lambda: _graph(R.AVG, (16, 64, 1024), (16, 1, 1024)),
        "reduction",
        [{"BLOCK_M": 64, "BLOCK_K": 32, "SPLIT": 4, "num_warps": 4}],
    ),
}


def test_kernels_compile_for_hopper():
    out = compile_for_hopper(__name__)
    assert out.count("compiled") >= len(HOPPER_CASES)


def test_int64_offsets_past_2_gib_elements():
    p = _piece(HOPPER_CASES["int64_offsets"][0]())
    source = TEMPLATE.generate(p, TEMPLATE.candidates(p, H100)[0], H100).source
    assert "tl.program_id(0).to(tl.int64)" in source and "k = (k0 + tl.arange" in source


# -- GPU, realistic sizes --------------------------------------------------------------------------
# Sums of thousands of random reals can cancel to near 0, where fp32 rounding of the partial sums
# exceeds the absolute tolerance; small integers keep every sum exact in fp32 (and check it is).
EXACT = {"integers": True, "low": -2, "high": 2}


@pytest.mark.gpu
@requires_cuda
def test_gpu_genstats_nhwc(rng):
    dims = [32, 256, 56, 56]
    g = og.Graph("gs", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    s, sq = g.genstats(x)
    s.set_output(True)
    sq.set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("mode", [R.ADD, R.MAX, R.NORM2])
def test_gpu_row_reduction_bf16(mode, rng):
    g = _graph(mode, (8192, 4096), (8192, 1), dt=DT.BFLOAT16)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)


@pytest.mark.gpu
@requires_cuda
def test_gpu_full_and_column_reductions(rng):
    g = og.Graph("fc", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4096, 1024], name="x")
    g.reduction(x, R.ADD).set_dim([1, 1024]).set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1, **EXACT)
    g = _graph(R.AVG, (1 << 22,), (1,))
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


def _int_values(pack):
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
            v[...] = np.arange(v.size).reshape(v.shape) * 7 % 11 - 3


def _fp64_piece_reductions(mode):
    """An fp64 piece (INT32/INT64 tensors) reducing FLOAT values (fp32 accumulators: the reducers'
    own type) beside an INT32 tensor reduced to INT32 and to FLOAT (fp64 accumulators)."""
    g = og.Graph("mix", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[5, 37], name="x")
    k = g.tensor(dim=[5, 37], name="k", data_type=DT.INT32)
    t = g.tensor(dim=[5, 1], name="t", data_type=DT.INT64)
    g.reduction(g.mul(x, 0.5), mode).set_dim([5, 1]).set_output(True)
    onehot = g.cmp_eq(g.gen_index(x, axis=1).set_data_type(DT.INT32), t).set_data_type(DT.FLOAT)
    g.reduction(g.mul(onehot, x), mode).set_dim([5, 1]).set_output(True)
    g.reduction(k, mode).set_dim([5, 1]).set_output(True).set_data_type(DT.INT32)
    g.reduction(k, mode).set_dim([5, 1]).set_output(True).set_data_type(DT.FLOAT)
    return g


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("mode", [R.ADD, R.MAX, R.MIN, R.MUL, R.AVG, R.NORM2, R.AMAX], ids=lambda m: m.name)
def test_split_fp64_piece_float_and_int32_reductions(mode, split, monkeypatch, rng):
    """Split-K partials in scratch of each reducer's accumulator type (fp32 for the FLOAT values, fp64
    for the INT32 ones and for products), folded by the combine launch."""
    _force(monkeypatch, BLOCK_M=2, BLOCK_K=8, SPLIT=split, num_warps=4)
    plan = assert_engine_matches(_fp64_piece_reductions(mode), rng, expect_steps=1, prepare=_int_values)
    kernel = plan.steps[0].kernel
    assert len(kernel.generated.launches) == (2 if split > 1 else 1) and (kernel.scratch_bytes > 0) == (split > 1)
    if split > 1:
        dtypes = [a.dtype for a in kernel.generated.launches[0].args if a.kind.name == "SCRATCH"]
        product = mode is R.MUL
        assert dtypes == ["float64" if product else "float32"] * 2 + ["float64"] * 2, dtypes


@pytest.mark.parametrize("split", [1, 3])
def test_genstats_of_integer_products_in_an_fp64_piece(split, monkeypatch, rng):
    _force(monkeypatch, BLOCK_M=2, BLOCK_K=8, SPLIT=split, num_warps=4)
    dims = [2, 4, 3, 5]
    g = og.Graph("gs", io_data_type=DT.FLOAT)
    x = g.tensor(dim=dims, name="x")
    k = g.tensor(dim=dims, name="k", data_type=DT.INT32)
    s, sq = g.genstats(g.mul(x, k).set_data_type(DT.FLOAT))
    s.set_output(True)
    sq.set_output(True)
    g.add(x, k).set_data_type(DT.INT32).set_output(True)  # a full-size integer output on the way
    assert_engine_matches(g, rng, expect_steps=1, prepare=_int_values)


VIEWED = {  # name: the view of x [3, 4, 10] the reduction (and its prologue) reads, and the output dims
    "flatten": (lambda g, x: g.reshape(x, [12, 10]), (12, 1)),
    "transpose": (lambda g, x: g.transpose(x, [0, 2, 1]), (3, 10, 1)),
    "slice": (lambda g, x: g.slice(x, [slice(None), slice(1, 3), slice(2, 9, 2)]), (3, 2, 1)),
    "chain": (lambda g, x: g.reshape(g.transpose(x, [1, 0, 2]), [12, 10]), None),  # (a copy: not one run)
}


@requires_interpreter
@pytest.mark.parametrize("case", VIEWED)
def test_views_of_inputs_are_read_in_place(case, rng):
    """Slices, transposes and reshapes of an input, read by the reduction and its pointwise prologue
    (a language model's flattened logits before the loss's row sums): one kernel, no copy, the sums
    the reference's. A view that needs a copy (axes merged that are not one run) stays a step of its
    own."""
    view, out = VIEWED[case]
    g = og.Graph("viewed", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 4, 10], name="x")
    v = view(g, x)
    shifted = g.sub(v, g.reduction(v, R.MAX, name="max").set_dim(list(out or (12, 1))), name="shift")
    g.reduction(g.exp(shifted, name="exp"), R.ADD, name="sum").set_dim(list(out or (12, 1))).set_output(True)
    plan = assert_engine_matches(g, rng)
    templates = [s.config.knob("template") for s in plan.steps]
    if out is None:
        assert "pointwise" in templates, plan.describe()
    else:
        assert templates == ["reduction", "reduction"], plan.describe()


def test_a_view_the_piece_would_store_is_refused():
    """The reduction template reads views in place and stores none: a view that is itself an output
    of the piece is a copy for another template."""
    g = og.Graph("stored", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 4, 10], name="x")
    v = g.reshape(x, [12, 10], name="flat").set_output(True)
    g.reduction(v, R.ADD, name="sum").set_dim([12, 1]).set_output(True)
    final = g.final
    verdict = analyze(make_piece(final, 0, final.nodes))
    assert not verdict and "stores none" in verdict.reason, verdict


@requires_interpreter
def test_a_flatten_read_in_place_in_a_dynamic_plan(rng):
    """The loss's row reductions over logits [batch, seq, classes] flattened to rows, batch and seq
    dynamic: both reductions read the flatten in place at every shape (no copy step), against the
    reference at the range's ends and between."""
    B, S = og.Dim("batch", 1, 9), og.Dim("seq", 1, 37)
    g = og.Graph("flat", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    flat = g.reshape(g.tensor(dim=[B, S, 24], name="x"), [-1, 24], name="flat")
    m = g.reduction(flat, R.MAX, name="max").set_dim([B * S, 1])
    shifted = g.exp(g.sub(flat, m, name="shift"), name="exp")
    g.reduction(shifted, R.ADD, name="sum").set_dim([B * S, 1]).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"])
    for env in ({"batch": 1, "seq": 1}, {"batch": 3, "seq": 19}, {"batch": 9, "seq": 37}):
        run_at_shape(plan, env, rng)
        assert [s.config.knob("template") for s in plan.at(env).steps] == ["reduction", "reduction"]
