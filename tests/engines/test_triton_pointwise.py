"""The Triton pointwise template against the reference engine: under the interpreter on the CPU
(small shapes) and, marked gpu, on CUDA at realistic sizes."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.pointwise import PointwiseMode
from opgraph.tools.samples import nhwc

from ..helpers import assert_engine_matches, pointwise_graph, requires_cuda, requires_interpreter

pytestmark = pytest.mark.interpreter
DT = og.DataType
M = PointwiseMode

SKIP = {M.GEN_INDEX}


@pytest.mark.parametrize("mode", [m for m in PointwiseMode if m not in SKIP], ids=lambda m: m.name)
def test_every_mode_fp32_nhwc(mode, rng):
    assert_engine_matches(pointwise_graph(mode, DT.FLOAT, "nhwc"), rng, expect_steps=1)


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode", [M.ADD, M.RELU_FWD, M.GELU_FWD, M.SIGMOID_BWD, M.CMP_GE, M.DIV])
def test_modes_by_dtype_and_layout(mode, dt, layout, rng):
    assert_engine_matches(pointwise_graph(mode, dt, layout), rng, expect_steps=1)


@pytest.mark.parametrize("mask", [1.0, 0.0, -2.5])
def test_select_by_a_literal_mask_is_the_chosen_operand(mask, rng):
    """binary_select with a literal mask is the chosen operand in the kernel (no tl.where: the other
    operand's load has no use, as a compute copy's update needs), with the reference engine's values."""
    g = og.Graph("sel", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    y = g.tensor(dim=[4, 8], name="y")
    g.binary_select(g.exp(x), y, mask).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    source = plan.steps[0].kernel.source()
    assert "tl.where" not in source.split("def kernel", 1)[1], source


def test_gen_index(rng):
    g = og.Graph("gi", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 4], name="x")
    g.gen_index(x, axis=1).set_output(True).set_data_type(DT.INT32)
    g.add(g.gen_index(x, axis=2), x).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_fused_dag_broadcast_scalars_casts_and_two_outputs(layout, rng):
    """relu(x*s + b + r) with s a pass-by-value scalar, b per channel, r a residual in the other layout,
    a device-memory clip, a mask output and a cast to int8."""
    dims = [2, 8, 5, 6]
    other = None if layout == "nhwc" else nhwc(dims)
    mine = nhwc(dims) if layout == "nhwc" else None
    g = og.Graph("dag", io_data_type=DT.HALF)
    x = g.tensor(dim=dims, stride=mine, name="x")
    r = g.tensor(dim=dims, stride=other, name="r")
    b = g.tensor(dim=[1, 8, 1, 1], name="b")
    s = g.tensor(dim=[1], data_type=DT.FLOAT, is_pass_by_value=True, name="s")
    clip = g.tensor(dim=[1], data_type=DT.FLOAT, name="clip")  # read from memory at run time
    t = g.add(g.bias(g.mul(x, s), b), r)
    y = g.relu(t, upper_clip=clip, name="relu").set_output(True).set_name("y")
    g.cmp_gt(t, 0.25).set_output(True).set_name("mask")
    g.identity(g.mul(y, 10.0)).set_output(True).set_data_type(DT.INT8).set_name("q")
    assert_engine_matches(g, rng, expect_steps=1)


def test_half_intermediate_is_rounded_like_the_reference(rng):
    g = og.Graph("round", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[64], name="x")
    h = g.mul(x, 1.0 / 3.0).set_data_type(DT.HALF)  # a virtual fp16 intermediate
    g.sub(g.mul(h, 3.0), x).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1, rtol=0, atol=1e-7)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_fused_dag(dt, rng):
    dims = [8, 64, 56, 56]
    g = og.Graph("dag", io_data_type=dt)
    x = g.tensor(dim=dims, stride=nhwc(dims), name="x")
    r = g.tensor(dim=dims, stride=nhwc(dims), name="r")
    b = g.tensor(dim=[1, 64, 1, 1], name="b")
    s = g.tensor(dim=[1, 64, 1, 1], name="s")
    g.relu(g.add(g.bias(g.mul(x, s), b), r)).set_output(True)
    assert_engine_matches(g, rng, device="cuda", expect_steps=1)


# -- slices and transposes of tensors in memory, read in place ------------------------------------------


def test_a_transposed_and_sliced_input_is_read_in_place(rng):
    g = og.Graph("views", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[2, 4, 8], name="x")
    b = g.tensor(dim=[1, 8, 1], name="b")
    view = g.slice(g.transpose(x, [0, 2, 1]), [slice(None), slice(None), slice(1, 4)])
    g.relu(g.add(view, b)).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise" and plan.workspace_size == 0
    assert "(p1 + 8)" in plan.source(0)  # the slice's start: column 1 of the transposed rows (stride 8)


def test_a_view_of_a_computed_value_or_a_view_written_out_is_not_this_templates():
    from opgraph.core.device import CPU
    from opgraph.engines.triton.templates.pointwise import TEMPLATE
    from opgraph.core.piece import make_piece

    g = og.Graph("computed", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.add(g.transpose(g.relu(x), [1, 0]), 1.0).set_output(True)
    fg = g.final
    verdict = TEMPLATE.match(make_piece(fg, 0, list(fg.nodes)), CPU)
    assert not verdict and "takes a computed value" in verdict.reason
    g = og.Graph("copy", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    g.transpose(x, [1, 0]).set_output(True)
    g.relu(x).set_output(True)
    fg = g.final
    verdict = TEMPLATE.match(make_piece(fg, 0, list(fg.nodes)), CPU)
    assert not verdict and "beside computed values" in verdict.reason


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.HALF, DT.BFLOAT16, DT.INT64], ids=lambda d: d.name)
@pytest.mark.parametrize("case", ["flatten", "transpose", "slice_of_transpose", "transpose_large"])
def test_views_alone_written_out_are_copies(case, dt, rng):
    """A graph output that is a view of an input (a language model's logits flattened to [B*S, V]) is a
    copy kernel: read through the view, written in the output's layout (a transpose keeps its input's
    memory order: a copy of the same bytes)."""
    g = og.Graph("copy", io_data_type=dt)
    x = g.tensor(dim=[3, 37, 45] if case == "transpose_large" else [3, 5, 7], name="x")
    if case == "transpose_large":
        y = g.transpose(x, [0, 2, 1])
    elif case == "flatten":
        y = g.reshape(x, [15, 7])
    elif case == "transpose":
        y = g.transpose(x, [2, 0, 1])
    else:
        y = g.slice(g.transpose(x, [0, 2, 1]), [slice(None), slice(1, 6, 2), slice(None)])
    y.set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.engine == "triton"


def test_a_view_read_by_two_pieces_runs_and_matches(rng):
    g = og.Graph("two_readers", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[4, 8], name="x")
    b = g.tensor(dim=[8, 1], name="b")
    y = g.tensor(dim=[8, 3], name="y")
    t = g.transpose(x, [1, 0])
    g.relu(g.add(t, b)).set_output(True)
    g.add(g.slice(t, [slice(None), slice(1, 4)]), y).set_output(True)
    assert_engine_matches(g, rng, engines=("triton", "torch"))


@pytest.mark.parametrize("out_type", [DT.INT32, DT.INT64, DT.FLOAT])
def test_integer_compares_and_indices_beside_fp32_math(out_type, rng):
    """A cross-entropy backward's shape: (exp(x - m) / s - (gen_index == target)) * seed, with INT64
    targets; gen_index also stored as `out_type` and compared with an INT32 tensor (every comparison
    mode). Integer values stay exact, the float math runs in fp32 (no float64 in the kernel body
    where no tensor is DOUBLE: see test_triton_reduction's test_integer_ops_keep_the_float_math_fp32)."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    g = og.Graph("ceb", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[3, 2, 11], name="x")
    m = g.tensor(dim=[3, 2, 1], name="m", data_type=DT.FLOAT)
    s = g.tensor(dim=[3, 2, 1], name="s", data_type=DT.FLOAT)
    t = g.tensor(dim=[3, 2, 1], name="t", data_type=DT.INT64)
    k = g.tensor(dim=[3, 2, 11], name="k", data_type=DT.INT32)
    soft = g.div(g.exp(g.sub(x, m)), s)
    idx = g.gen_index(x, axis=2).set_data_type(DT.INT32)
    onehot = g.cmp_eq(idx, t).set_data_type(DT.FLOAT)
    g.mul(g.sub(soft, onehot), 0.5).set_output(True).set_name("dx")
    g.gen_index(x, axis=2).set_data_type(out_type).set_output(True).set_name("i")
    for mode in (M.CMP_NEQ, M.CMP_GT, M.CMP_GE, M.CMP_LT, M.CMP_LE):
        g.pointwise(idx, k, mode=mode).set_data_type(DT.FLOAT).set_output(True)

    def prepare(pack):
        final = g.final
        for uid, v in pack.items():
            if final.tensors[uid].data_type in (DT.INT64, DT.INT32) and uid in final.inputs:
                v[...] = np.arange(v.size).reshape(v.shape) * 5 % 11

    assert_engine_matches(g, rng, expect_steps=1, prepare=prepare)
    final = g.final
    piece = make_piece(final, 0, final.nodes)
    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    body = TEMPLATE.generate(piece, TEMPLATE.candidates(piece, h100)[0], h100).source
    body = body[body.index("def kernel(") :]
    assert "tl.exp(" in body and ".to(tl.int64) ==" in body, body
    exp_line = next(line for line in body.splitlines() if "tl.exp(" in line)
    assert "float64" not in exp_line, body


def _transposed(dims, perm, out_dt=DT.BFLOAT16, io=DT.FLOAT):
    """y = x * 2 + b (+ gen_index along the first axis) with x packed in axis order `perm` and y
    packed row-major: the tiled walk reads x and writes y along their contiguous axes."""
    g = og.Graph("t", io_data_type=io)
    strides, acc = [0] * len(dims), 1
    for a in reversed(perm):
        strides[a] = acc
        acc *= dims[a]
    x = g.tensor(dim=list(dims), stride=strides, name="x")
    b = g.tensor(dim=[1] * (len(dims) - 1) + [dims[-1]], name="b")
    lead = g.tensor(dim=[dims[0]] + [1] * (len(dims) - 1), stride=[0] * len(dims), name="lead")
    i = g.gen_index(x, axis=0).set_data_type(DT.FLOAT)
    y = g.add(g.add(g.mul(x, 2.0), b), g.mul(i, lead)).set_output(True).set_data_type(out_dt)
    y.set_stride(list(np.cumprod([1, *dims[::-1]])[:-1][::-1].tolist()))
    return g


@pytest.mark.parametrize(
    "dims,perm",
    [((300, 260), (1, 0)), ((3, 70, 130), (0, 2, 1)), ((2, 3, 40, 50), (0, 3, 1, 2)), ((5, 130, 33), (2, 0, 1))],
)
def test_transposed_input_walks_tiles(dims, perm, rng):
    """A cast of a transposed weight (GPT-2's tied lm_head: [50304, 768] fp32 read as its transpose)
    reads with a stride in the flat walk; the template tiles the two contiguous axes instead."""
    plan = assert_engine_matches(_transposed(dims, perm), rng, expect_steps=1)
    assert plan.steps[0].config.knob("TILE_I") is not None, plan.describe()


def test_flat_walk_where_nothing_is_transposed(rng):
    plan = assert_engine_matches(_transposed((40, 300), (0, 1)), rng, expect_steps=1)
    assert plan.steps[0].config.knob("BLOCK") is not None, plan.describe()


def _narrow_product(io, inter, compute):
    """a - b * 0.4140625 with the product a virtual intermediate of type `inter` (fuzz seed
    20261125910499: fp16 intermediates in an fp32 kernel)."""
    g = og.Graph("narrow", io_data_type=io, intermediate_data_type=inter, compute_data_type=compute)
    a, b = g.tensor(dim=[4096], name="a"), g.tensor(dim=[4096], name="b")
    g.sub(a, g.mul(b, 0.4140625)).set_output(True).set_name("y")
    return g


NARROW = {
    "narrow_f16_in_f32": (DT.HALF, DT.HALF, DT.FLOAT),
    "narrow_f16_in_f64": (DT.DOUBLE, DT.HALF, DT.DOUBLE),
    "narrow_f32_in_f64": (DT.DOUBLE, DT.FLOAT, DT.DOUBLE),
}


def _ce_backward(rows, vocab):
    """CrossEntropy.gradient's chain (opgraph/training/losses.py) over bf16 logits [*rows, vocab]:
    dlogits = (exp(x - m) / s - (class == t)) * w, with m, s, w FLOAT and t INT64 per row."""
    g = og.Graph("ce_bwd", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    x = g.tensor(dim=[*rows, vocab], name="logits")
    m, s, w = (g.tensor(dim=[*rows, 1], name=n, data_type=DT.FLOAT) for n in ("m", "s", "w"))
    t = g.tensor(dim=[*rows, 1], name="target", data_type=DT.INT64)
    p = g.div(g.exp(g.sub(x, m).set_data_type(DT.FLOAT)).set_data_type(DT.FLOAT), s).set_data_type(DT.FLOAT)
    onehot = g.cmp_eq(g.gen_index(x, len(rows)), t).set_data_type(DT.FLOAT)
    g.mul(g.sub(p, onehot).set_data_type(DT.FLOAT), w).set_output(True).set_name("dlogits").set_data_type(DT.BFLOAT16)
    return g


def _transposed_add(rows, cols):
    """The tied embedding's two gradients added (bench/gpt.py): a [rows, cols] read transposed (stride
    [1, rows]) plus b packed, y packed like b."""
    g = og.Graph("tadd", io_data_type=DT.FLOAT)
    a = g.tensor(dim=[rows, cols], stride=[1, rows], name="a")
    b = g.tensor(dim=[rows, cols], name="b")
    g.add(a, b).set_output(True).set_name("y").set_stride([cols, 1])
    return g


def _literal_operands():
    """x ** 2.0 (a literal exponent: torch's x ** 2) and fmod(3.0, x) (a literal dividend): their helpers
    read operand types, which literals have none of when compiled (the interpreter accepts them)."""
    g = og.Graph("literals", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[4096], name="x")
    g.add(g.pow(x, 2.0), g.mod(3.0, x)).set_output(True)
    return g


HOPPER_CASES = {
    "literal_operands": (_literal_operands, "pointwise", None),
    "transposed_cast": (lambda: _transposed((50304, 768), (1, 0)), "pointwise", None),
    "transposed_add": (lambda: _transposed_add(50304, 768), "pointwise", lambda cands: cands[:3]),
    **{name: (lambda types=types: _narrow_product(*types), "pointwise", None) for name, types in NARROW.items()},
    # GPT-2's cross-entropy backward (bench/gpt.py): the row walk (the heuristic's) and the flat walk
    "ce_backward_gpt2": (
        lambda: _ce_backward((8, 1024), 50304),
        "pointwise",
        lambda cands: [cands[0], next(c for c in cands if "BLOCK" in c)],
    ),
}


def test_kernels_compile_for_hopper():
    """Every case compiles for sm_90 without spills; the narrow intermediates' round trips survive
    compilation (no fp16 arithmetic: LLVM turned a - fp16(b * c) into one fma.rn.f16 before they were
    cvt instructions)."""
    from .hopper_compile import compile_for_hopper

    out = compile_for_hopper(__name__)
    lines = [line.split() for line in out.splitlines() if line.startswith("compiled")]
    assert {w[1] for w in lines} == set(HOPPER_CASES), out
    for w in lines:
        assert w[6] == "0", w  # spills
        if w[1] == "transposed_add":  # each side read or written along its contiguous axis, in 128-bit vectors
            assert w[15:21] == ["ld.v4", "16", "st.v4", "8", "ld.1", "0"], w
        if w[1] == "ce_backward_gpt2":
            access = dict(zip(w[15:23:2], map(int, w[16:23:2])))
            if "'ROWS':" in " ".join(w):  # logits in 128-bit vectors, each row's m, s, t, w loaded once, no division
                assert access["ld.v4"] >= 2 and access["st.v4"] >= 2 and access["ld.1"] <= 4, w
                assert access["mul.hi"] <= 2, w  # (the program id's: a few per program)
            else:  # the flat walk: a load of each per-row value per element, a division per element
                assert access["ld.1"] >= 4 * 8 and access["mul.hi"] >= 8, w
        if w[1] in NARROW:  # no narrow arithmetic: fp16 in the fp32 kernel, fp16 or fp32 in the fp64 ones
            assert w[11:13] == ["f16math", "0"], w
            if NARROW[w[1]][2] is DT.DOUBLE:
                assert w[13:15] == ["f32math", "0"], w


@pytest.mark.parametrize("name", sorted(NARROW))
def test_narrow_intermediates_are_rounded_by_instructions(name, rng):
    """The interpreter computes them like the reference; the source rounds through _og_round_* helpers."""
    g = _narrow_product(*NARROW[name])
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert "_og_round_f" in _body(plan), _body(plan)


# -- fp64 pieces: each node in its own type (review of the per-node compute types) --------------------


def _int_inputs(pack):
    """Small integers in the integer inputs (some equal to the constants compared with), a pattern in
    the booleans."""
    for v in pack.values():
        if isinstance(v, np.ndarray) and v.dtype.kind in "iu":
            v[...] = np.arange(v.size).reshape(v.shape) * 5 % 7 - (v.dtype.kind == "i")
        elif isinstance(v, np.ndarray) and v.dtype == bool:
            v[...] = np.arange(v.size).reshape(v.shape) % 3 == 0


def _body(plan, step=0):
    source = plan.source(step)
    return source[source.index("def kernel(") :]


def test_integer_compared_with_constants_no_fp64_in_a_float_piece(rng):
    """INT32 == 3 read by fp32 math, INT32 > 2 stored as INT32, INT64 gen_index == INT64 tensor stored
    as INT64: the integers compare in int64 and every 0/1 result is made in its output's type, so no
    fp64 value appears in a piece that has no DOUBLE tensor (before: (k.to(fp64) == 3.0) in fp64,
    rounded through fp32 and back, and integer outputs through fp64 and _og_to_int)."""
    g = og.Graph("cmpc", io_data_type=DT.FLOAT)
    k = g.tensor(dim=[4, 9], name="k", data_type=DT.INT32)
    t = g.tensor(dim=[4, 9], name="t", data_type=DT.INT64)
    x = g.tensor(dim=[4, 9], name="x")
    g.mul(g.cmp_eq(k, 3.0).set_data_type(DT.FLOAT), x).set_output(True)
    g.pointwise(k, 2.0, mode=M.CMP_GT).set_data_type(DT.INT32).set_output(True)
    g.pointwise(-1.0, k, mode=M.CMP_LE).set_data_type(DT.BOOLEAN).set_output(True)
    g.cmp_eq(g.gen_index(x, axis=1).set_data_type(DT.INT64), t).set_data_type(DT.INT64).set_output(True)
    g.pointwise(k, 2.5, mode=M.CMP_LT).set_data_type(DT.FLOAT).set_output(True)  # not integral: compared in fp64
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=_int_inputs)
    body = _body(plan)
    assert "== 3)" in body and "> 2)" in body, body
    assert body.count("tl.float64") == 1 and "2.5" in next(ln for ln in body.splitlines() if "tl.float64" in ln), body


def _mixed_int_graph(case):
    g = og.Graph(case, io_data_type=DT.FLOAT)
    x, y = g.tensor(dim=[4, 9], name="x"), g.tensor(dim=[4, 9], name="y")
    k = g.tensor(dim=[4, 9], name="k", data_type=DT.INT32)
    if case == "min_max_select":
        j = g.tensor(dim=[4, 9], name="j", data_type=DT.INT64)
        g.pointwise(k, j, mode=M.MAX).set_data_type(DT.INT64).set_output(True)
        g.pointwise(k, j, mode=M.MIN).set_data_type(DT.INT32).set_output(True)
        g.pointwise(x, y, k, mode=M.BINARY_SELECT).set_output(True)  # an integer condition
        g.add(k, x).set_data_type(DT.FLOAT).set_output(True)
    elif case == "bool_int8_uint8":
        b = g.tensor(dim=[4, 9], name="b", data_type=DT.BOOLEAN)
        i8 = g.tensor(dim=[4, 9], name="i8", data_type=DT.INT8)
        u8 = g.tensor(dim=[4, 9], name="u8", data_type=DT.UINT8)
        g.pointwise(x, u8, b, mode=M.BINARY_SELECT).set_output(True)
        g.add(i8, k).set_data_type(DT.INT8).set_output(True)
        g.mul(u8, x).set_data_type(DT.UINT8).set_output(True)
        g.cmp_eq(k, i8).set_data_type(DT.BOOLEAN).set_output(True)
        g.cmp_lt(k, u8).set_data_type(DT.FLOAT).set_output(True)
        g.mul(y, b).set_output(True)
    elif case == "pass_by_value":
        s = g.tensor(dim=[1, 1], name="s", data_type=DT.INT32, is_pass_by_value=True)
        f = g.tensor(dim=[1, 1], name="f", data_type=DT.FLOAT, is_pass_by_value=True)
        g.cmp_eq(k, s).set_data_type(DT.FLOAT).set_output(True)
        g.mul(g.add(x, s), g.mul(f, y)).set_output(True)
        g.add(k, s).set_data_type(DT.INT32).set_output(True)
    elif case == "gen_index_int_and_float":  # one INT32 coordinate stored, multiplied, compared, added
        t = g.tensor(dim=[4, 9], name="t", data_type=DT.INT64)
        i = g.gen_index(x, axis=1).set_data_type(DT.INT32).set_output(True)
        g.mul(i, x).set_output(True)
        g.cmp_eq(i, t).set_data_type(DT.INT64).set_output(True)
        g.add(i, t).set_data_type(DT.INT64).set_output(True)
        g.cmp_ge(i, 4.0).set_data_type(DT.INT32).set_output(True)
        g.add(y, k).set_data_type(DT.FLOAT).set_output(True)
        g.gen_index(x, axis=0).set_data_type(DT.INT64).set_output(True)
    elif case == "double_beside_float":  # exactly rounded ops: a DOUBLE output's tolerance is tight
        d = g.tensor(dim=[4, 9], name="d", data_type=DT.DOUBLE)
        h = g.tensor(dim=[4, 9], name="h", data_type=DT.HALF)
        t = g.mul(x, y).set_data_type(DT.FLOAT)
        g.add(t, d).set_data_type(DT.DOUBLE).set_output(True)
        g.mul(t, h).set_data_type(DT.BFLOAT16).set_output(True)
        g.sub(d, h).set_data_type(DT.HALF).set_output(True)
        g.cmp_gt(d, k).set_data_type(DT.FLOAT).set_output(True)
    return g


@pytest.mark.parametrize(
    "case", ["min_max_select", "bool_int8_uint8", "pass_by_value", "gen_index_int_and_float", "double_beside_float"]
)
def test_fp64_piece_integer_and_narrow_types(case, rng):
    """MIN/MAX of integers, an integer select condition, BOOLEAN/INT8/UINT8 beside INT32, integer
    pass-by-value scalars, a gen_index stored as INT32 and read by float math, DOUBLE beside fp32."""
    assert_engine_matches(_mixed_int_graph(case), rng, expect_steps=1, prepare=_int_inputs)


# -- the tiled walk: the cases around a transposed tensor ---------------------------------------------


def _strides(dims, perm):
    strides, acc = [0] * len(dims), 1
    for a in reversed(perm):
        strides[a] = acc
        acc *= dims[a]
    return strides


def _tiled_graph(case):
    g = og.Graph(case, io_data_type=DT.FLOAT)
    if case == "broadcasts_and_indices":  # [c, i, j]: per-program, stride-0, column inputs, gen_index per axis
        dims = [3, 40, 70]
        x = g.tensor(dim=dims, stride=_strides(dims, (0, 2, 1)), name="x")
        outer = g.tensor(dim=[3, 1, 1], name="outer")  # a scalar load per program, no mask
        z = g.tensor(dim=dims, stride=[0, 0, 1], name="z")  # broadcast in memory
        col = g.tensor(dim=[1, 40, 1], name="col")
        y = g.add(g.mul(x, outer), g.add(z, col))
        for a in range(3):
            y = g.add(y, g.gen_index(x, axis=a).set_data_type(DT.FLOAT))
        y.set_output(True).set_stride(_strides(dims, (0, 1, 2)))
        g.gen_index(x, axis=0).set_data_type(DT.INT32).set_output(True).set_stride(_strides(dims, (0, 1, 2)))
        g.gen_index(x, axis=1).set_data_type(DT.INT64).set_output(True).set_stride(_strides(dims, (0, 2, 1)))
    elif case == "gapped_outputs_two_layouts":
        x = g.tensor(dim=[64, 80], stride=[1, 64], name="x")
        g.relu(x).set_output(True).set_stride([100, 1])  # rows with a gap
        g.exp(x).set_output(True).set_stride([1, 70])  # column-major with a gap
    elif case == "first_output_transposed":
        x = g.tensor(dim=[70, 90], name="x")
        g.mul(x, 3.0).set_data_type(DT.HALF).set_output(True).set_stride([1, 70])
    elif case == "one_element_axes":
        dims = [2, 1, 60, 1, 70]
        x = g.tensor(dim=dims, stride=_strides(dims, (0, 1, 4, 3, 2)), name="x")
        g.add(x, g.gen_index(x, axis=1).set_data_type(DT.FLOAT)).set_output(True).set_stride(_strides(dims, range(5)))
        g.gen_index(x, axis=3).set_data_type(DT.INT32).set_output(True).set_stride(_strides(dims, range(5)))
    elif case == "slice_of_a_transposed_weight":  # a view read in place
        w = g.tensor(dim=[90, 100], stride=[1, 90], name="w")
        g.add(g.slice(w, [slice(5, 85), slice(10, 90)]), g.tensor(dim=[80, 80], name="b")).set_output(True)
    elif case == "fp64_piece":  # integer values on the tiled walk
        x = g.tensor(dim=[64, 90], stride=[1, 64], name="x")
        k = g.tensor(dim=[64, 1], name="k", data_type=DT.INT32)
        i = g.gen_index(x, axis=1).set_data_type(DT.INT32)
        g.mul(g.cmp_eq(i, k).set_data_type(DT.FLOAT), x).set_output(True).set_stride([90, 1])
        i.set_output(True).set_stride([90, 1])
    return g


@pytest.mark.parametrize(
    "case",
    [
        "broadcasts_and_indices",
        "gapped_outputs_two_layouts",
        "first_output_transposed",
        "one_element_axes",
        "slice_of_a_transposed_weight",
        "fp64_piece",
    ],
)
def test_tiled_walk_cases(case, rng):
    plan = assert_engine_matches(_tiled_graph(case), rng, expect_steps=1, prepare=_int_inputs)
    assert plan.steps[0].config.knob("TILE_I") is not None, plan.describe()


def test_tiled_walk_int64_offsets():
    """A transposed tensor past 2**31 elements: program ids (and so every coordinate) are int64."""
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    final = _transposed((3, 50304, 16384), (0, 2, 1)).final
    piece = make_piece(final, 0, final.nodes)
    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    knobs = TEMPLATE.candidates(piece, h100)[0]
    source = TEMPLATE.generate(piece, knobs, h100).source
    assert "TILE_I" in knobs and "pid = tl.program_id(0).to(tl.int64)" in source, source


def test_tile_knobs_in_a_plan_file_for_a_flat_piece_are_a_typed_error(rng):
    """Candidates offer TILE_I/TILE_J only where transposed_axes finds a transposed tensor; a plan
    file that holds them for another piece is refused when loaded (not a ValueError from generate)."""
    import json

    from opgraph.core.errors import SerializationError
    from opgraph.runtime.plan import ExecutionPlan
    from opgraph.runtime.plan_io import MAGIC_1

    g = _transposed((40, 300), (0, 1))
    plan = g.build(device="cpu", engines=["triton"])
    assert all(
        "TILE_I" not in c
        for c in __import__("opgraph.engines.triton.templates.pointwise", fromlist=["TEMPLATE"]).TEMPLATE.candidates(
            plan.steps[0].piece, plan.device
        )
    )
    doc = json.loads(plan.to_bytes(embed_kernels=False).split(b"\n", 1)[1])
    doc["steps"][0]["config"]["knobs"] = [["template", "pointwise"], ["TILE_I", 64], ["TILE_J", 64], ["num_warps", 4]]
    with pytest.raises(SerializationError) as info:
        ExecutionPlan.from_bytes(MAGIC_1 + json.dumps(doc).encode())
    assert info.value.rule == "plan.knobs", str(info.value)


# -- the row walk: per-row values and coordinates on rows (a cross-entropy backward) -------------------


def _row_graph(case):
    g = og.Graph(case, io_data_type=DT.FLOAT)
    if case == "per_row_and_column_no_masks":  # tiles divide both axes: no mask at all
        x = g.tensor(dim=[24, 768], name="x")
        mean, rstd = g.tensor(dim=[24, 1], name="mean"), g.tensor(dim=[24, 1], name="rstd")
        gamma = g.tensor(dim=[1, 768], name="gamma")
        y = g.mul(g.mul(g.sub(x, mean), rstd), gamma)
        g.add(y, g.gen_index(x, axis=0).set_data_type(DT.FLOAT)).set_output(True)
        g.gen_index(x, axis=1).set_data_type(DT.INT32).set_output(True)
    elif case == "outer_axes_layouts_and_broadcasts":  # [2, 3, 5, 1000]: i = 2 (ragged), 0 and 1 per program
        dims = [2, 3, 5, 1000]
        x = g.tensor(dim=dims, stride=_strides(dims, (1, 0, 2, 3)), name="x")  # the outer axes swapped
        z = g.tensor(dim=dims, stride=[0, 0, 1000, 1], name="z")  # broadcast in memory
        outer = g.tensor(dim=[2, 3, 1, 1], name="outer")  # one value a program, no mask
        row = g.tensor(dim=[2, 1, 5, 1], name="row", data_type=DT.HALF)
        col = g.tensor(dim=[1, 1, 1, 1000], name="col")
        y = g.add(g.mul(x, outer), g.mul(z, row))
        y = g.add(y, col)
        for a in (0, 2, 3):
            y = g.add(y, g.gen_index(x, axis=a).set_data_type(DT.FLOAT))
        y.set_output(True).set_data_type(DT.BFLOAT16)
        g.relu(y).set_output(True).set_data_type(DT.HALF)
    elif case == "gapped_rows_two_outputs":
        x = g.tensor(dim=[40, 1000], stride=[1100, 1], name="x")
        r = g.tensor(dim=[40, 1], name="r", data_type=DT.BFLOAT16)
        g.mul(x, r).set_output(True).set_stride([1024, 1]).set_data_type(DT.HALF)
        g.cmp_gt(x, r).set_output(True).set_data_type(DT.BOOLEAN)
    elif case == "slice_read_in_place":
        w = g.tensor(dim=[12, 1100], name="w")
        r = g.tensor(dim=[12, 1], name="r")
        g.mul(g.slice(w, [slice(0, 12), slice(50, 1050)]), r).set_output(True)
    elif case == "update_in_place":  # W -= W * r, W's UID
        w = g.tensor(dim=[6, 1000], name="W", uid=100, data_type=DT.BFLOAT16)
        r = g.tensor(dim=[6, 1], name="r")
        g.sub(w, g.mul(w, r)).set_uid(100).set_output(True)
    elif case == "fp64_piece":
        d = g.tensor(dim=[6, 1000], name="d", data_type=DT.DOUBLE)
        k = g.tensor(dim=[6, 1], name="k", data_type=DT.INT32)
        i = g.gen_index(d, axis=1).set_data_type(DT.INT32)
        g.add(g.cmp_eq(i, k).set_data_type(DT.DOUBLE), d).set_output(True)
        g.pointwise(i, k, mode=M.MAX).set_data_type(DT.INT64).set_output(True)
    return g


ROW_CASES = [
    "per_row_and_column_no_masks",
    "outer_axes_layouts_and_broadcasts",
    "gapped_rows_two_outputs",
    "slice_read_in_place",
    "update_in_place",
    "fp64_piece",
]


def _positive(*names):
    """prepare: the named inputs made >= 0.5 (a divisor), integers small (some equal to a class)."""

    def prepare(pack, graph):
        _int_inputs(pack)
        for u, t in graph.tensors.items():
            if t.name in names:
                pack[u][...] = 0.5 + np.abs(pack[u])

    return prepare


@pytest.mark.parametrize("case", ROW_CASES)
def test_row_walk_cases(case, rng):
    plan = assert_engine_matches(_row_graph(case), rng, expect_steps=1, prepare=_int_inputs)
    assert plan.steps[0].config.knob("ROWS") is not None, plan.describe()


@pytest.mark.parametrize("rows,vocab", [((2, 3), 1000), ((5,), 2100)])
def test_cross_entropy_backward_walks_rows(rows, vocab, rng):
    """dlogits over [*rows, vocab]: ROWS x COLS tiles (the tiles ragged along the rows and the vocabulary),
    the per-row values loaded once per row, class ids an arange."""
    g = _ce_backward(rows, vocab)
    prepare = _positive("s")
    plan = assert_engine_matches(g, rng, expect_steps=1, prepare=lambda pack: prepare(pack, g.final))
    assert plan.steps[0].config.knob("ROWS") is not None, plan.describe()
    assert "lin" not in _body(plan) and "//" not in _body(plan).split("mask_j")[1], _body(plan)


def _piece(g):
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece

    final = g.final
    return make_piece(final, 0, final.nodes), Device("cuda", 0, "H100", (9, 0), 132)


def test_gpt2_cross_entropy_backward_ranks_the_row_walk_first():
    """bench/gpt.py's [8, 1024, 50304] logits: 1 x 2048 tiles of 4 warps first (the last of a row's 25
    tiles masks 45% off: 1.8% of the work), the flat walk's configs after; per-row values loaded
    without a mask (the tiles divide the rows), the outer axis per program."""
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    piece, h100 = _piece(_ce_backward((8, 1024), 50304))
    cands = TEMPLATE.candidates(piece, h100)
    assert cands[0] == {"ROWS": 1, "COLS": 2048, "num_warps": 4}, cands
    assert {"BLOCK": 2048, "num_warps": 4} in cands, cands  # the old pick, for the autotuner to compare
    source = TEMPLATE.generate(piece, cands[0], h100).source
    body = source[source.index("def kernel(") :]
    assert "lin" not in body and "mask_i" not in body and "c0 = pid_o % 8" in body, body
    loads = [line for line in body.splitlines() if "tl.load(" in line]
    assert sum("c0 * 1024 + c1)" in line for line in loads) == 4, body  # m, s, t, w: unmasked, per row
    assert sum("mask=mask_j" in line for line in loads) == 1, body  # the logits
    assert "_og_bf16_exact(v" in body, body  # stored by the bits rounded once


def test_row_walk_int64_offsets():
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    piece, h100 = _piece(_ce_backward((8, 8192), 50304))  # 3.3e9 elements
    knobs = TEMPLATE.candidates(piece, h100)[0]
    source = TEMPLATE.generate(piece, knobs, h100).source
    assert "ROWS" in knobs and "pid = tl.program_id(0).to(tl.int64)" in source, source


@pytest.mark.parametrize("case", ["same_layout", "pow2_columns", "short_rows", "wasteful_tail"])
def test_flat_walk_first_where_rows_gain_nothing(case):
    """No coordinate (x + y), only a power-of-two column's (a bias over [64, 1024]), rows shorter than
    ROW_MIN: the flat walk only. A row's last tile masking off more than 1/16: the flat walk first."""
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    g = og.Graph(case, io_data_type=DT.FLOAT)
    cols = {"same_layout": 1000, "pow2_columns": 1024, "short_rows": 100, "wasteful_tail": 300}[case]
    x = g.tensor(dim=[64, cols], name="x")
    other = g.tensor(
        dim=[64, cols] if case == "same_layout" else [1, cols] if case == "pow2_columns" else [64, 1], name="o"
    )
    g.add(x, other).set_output(True)
    piece, h100 = _piece(g)
    cands = TEMPLATE.candidates(piece, h100)
    assert "BLOCK" in cands[0], cands
    assert any("ROWS" in c for c in cands) == (case == "wasteful_tail"), cands


def test_row_knobs_in_a_plan_file_for_a_flat_piece_are_a_typed_error():
    import json

    from opgraph.core.errors import SerializationError
    from opgraph.runtime.plan import ExecutionPlan
    from opgraph.runtime.plan_io import MAGIC_1

    plan = _transposed((40, 300), (0, 1)).build(device="cpu", engines=["triton"])
    doc = json.loads(plan.to_bytes(embed_kernels=False).split(b"\n", 1)[1])
    doc["steps"][0]["config"]["knobs"] = [["template", "pointwise"], ["COLS", 256], ["ROWS", 8], ["num_warps", 4]]
    with pytest.raises(SerializationError) as info:
        ExecutionPlan.from_bytes(MAGIC_1 + json.dumps(doc).encode())
    assert info.value.rule == "plan.knobs", str(info.value)


# -- views that no strides describe: copies through coordinates (templates/_view_copy.py) ------------------


def _windows(g, x, b, h, w, c, win):
    """Swin's window partition of x [B, H, W, C]: [B * nW, win * win, C] (a reshape of a transpose that
    merges axes which are not one run of memory)."""
    v = g.reshape(x, [b, h // win, win, w // win, win, c], name="grid")
    v = g.transpose(v, [0, 1, 3, 2, 4, 5], name="windows")
    return g.reshape(v, [b * (h // win) * (w // win), win * win, c], name="flat")


@pytest.mark.parametrize("dt", [og.DataType.FLOAT, og.DataType.BFLOAT16], ids=lambda d: d.name)
def test_window_partition_is_a_copy_kernel(dt, rng):
    """The windows, read by a layernorm (which cannot read them in place): a pointwise copy step, then the
    layernorm; no torch step."""
    g = og.Graph("win", io_data_type=dt)
    x = g.tensor(dim=[2, 4, 6, 3], name="x")
    win = _windows(g, x, 2, 4, 6, 3, 2)
    s = g.tensor(dim=[1, 1, 3], data_type=og.DataType.FLOAT, name="s")
    y, _, _ = g.layernorm(og.NormForwardPhase.INFERENCE, win, s, None, epsilon=1e-5)
    y.set_output(True)
    plan = assert_engine_matches(g, rng, engines=("triton", "torch"))
    assert [st.config.engine for st in plan.steps] == ["triton", "triton"], plan.describe()
    assert plan.steps[0].config.knob("template") == "pointwise"
    assert {n.kind for n in plan.steps[0].piece.nodes} == {"reshape", "transpose"}


def test_patch_unfolding_with_a_slice_written_out(rng):
    """MobileViT's unfolding of a sliced NCHW tensor into patches, a graph output: the slice's offset and
    the transposes and reshapes mapped back per element."""
    g = og.Graph("patches", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 5, 4, 6], name="x")
    v = g.slice(x, [slice(None), slice(1, 4)])  # [2, 3, 4, 6]
    v = g.reshape(v, [2 * 3 * 2, 2, 3, 2])  # (N C h) ph (w) pw
    v = g.transpose(v, [0, 2, 1, 3])  # (N C h) w ph pw
    v = g.reshape(v, [2, 3, 6, 4])  # N C (h w) (ph pw)
    g.transpose(v, [0, 3, 2, 1]).set_output(True)  # N (ph pw) (h w) C
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise"


def test_a_copy_of_one_element(rng):
    """A view copy whose every axis has size 1 (transformers' zeros expanded to a batch of 1, a reshape by
    its output's dims): one element read, not a block through a scalar pointer."""
    g = og.Graph("one", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[1, 1], name="x")
    g.reshape(x).set_dim([1, 1, 1]).set_output(True)
    plan = assert_engine_matches(g, rng, expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise"


def test_a_copy_of_one_element_sliced_from_a_table_tensor(rng):
    """A view copy whose output is one element at a nonzero offset (a stepped slice of a reshape of a
    tensor read through the address table): a scalar load, no block mask on a scalar pointer (fuzz seed
    20261211002334)."""
    g = og.Graph("one_sliced", io_data_type=og.DataType.HALF)
    x = g.tensor(dim=[2, 2, 3], stride=[2, 1, 0], name="x").set_is_by_reference(True)
    v = g.reshape(x, [6, 2])
    g.slice(v, [slice(3, 5, 2), slice(0, 2, 2)]).set_output(True)
    plan = assert_engine_matches(g, rng, engines=("triton",), expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise"


@pytest.mark.parametrize(
    "source, between, out",
    [
        (og.DataType.INT32, None, og.DataType.BFLOAT16),  # (fuzz seed 20261201000253: NaN, the bits stored)
        (og.DataType.BFLOAT16, None, og.DataType.FLOAT),
        (og.DataType.FLOAT, og.DataType.HALF, og.DataType.FLOAT),  # (the virtual fp16 rounds)
    ],
    ids=lambda d: getattr(d, "name", str(d)),
)
def test_a_copy_converts_to_each_declared_type(source, between, out, rng):
    """A view copy whose views are declared other types converts as the reference rounds, link by link
    (a BFLOAT16 is moved as its bits: stored unconverted, an integer became a NaN)."""
    g = og.Graph("copy_cast", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[3, 4, 4], stride=[1, 12, 3], data_type=source, name="x")
    v = g.reshape(x, [8, 6])
    if between is not None:
        v.set_data_type(between)
        v = g.transpose(v, [1, 0])
    v.set_output(True).set_data_type(out)
    plan = assert_engine_matches(g, rng, engines=("triton",), expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise"


def test_a_strided_view_alone_is_copied_or_left_to_its_reader(rng):
    """Views alone that strides describe are copied by the pointwise template (not beside views that need a
    copy through coordinates), but the partitioner leaves them to the kernel reading them, which reads
    them in place (here a matmul: one step)."""
    from opgraph.core.device import CPU
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.pointwise import TEMPLATE

    g = og.Graph("t", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 4, 6, 3], name="x")
    win = _windows(g, x, 2, 4, 6, 3, 2)  # [12, 4, 3]
    xt = g.transpose(g.tensor(dim=[12, 3, 4], name="t"), [0, 2, 1])  # [12, 4, 3], strided
    g.add(win, xt).set_output(True)
    fg = g.final
    views = [n for n in fg.nodes if n.kind != "pointwise"]
    verdict = TEMPLATE.match(make_piece(fg, 0, views), CPU)
    assert not verdict and "strided view" in verdict.reason, verdict.reason
    verdict = TEMPLATE.match(make_piece(fg, 0, [n for n in views if n.kind == "transpose"][-1:]), CPU)
    assert verdict, verdict.reason
    g = og.Graph("t", io_data_type=og.DataType.FLOAT)
    xt = g.transpose(g.tensor(dim=[2, 6, 5], name="x"), [0, 2, 1])
    g.matmul(xt, g.tensor(dim=[1, 6, 3], name="w")).set_output(True)
    assert_engine_matches(g, rng, expect_steps=1)


@pytest.mark.gpu
@requires_cuda
def test_gpu_swin_window_partition_copy(rng):
    """Swin-T's first stage on the GPU: the 7x7 windows of [32, 56, 56, 96] bf16 as a copy kernel."""
    g = og.Graph("win", io_data_type=og.DataType.BFLOAT16)
    x = g.tensor(dim=[32, 56, 56, 96], name="x")
    _windows(g, x, 32, 56, 56, 96, 7).set_output(True)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1)
    assert plan.steps[0].config.knob("template") == "pointwise"
