"""Dynamic plans whose generated kernels take their sizes at run time (design steps 5-7): pointwise
graphs built once with dynamic dims, run under Triton's interpreter at many shapes (ones, primes,
the range's ends, random) against the reference engine at each shape (random inputs, poisoned
outputs); one kernel per bucket and step, whatever the shape; nothing built on the hot path; the
buckets and every new kernel reported."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import opgraph as og
from opgraph.engines import get_engine
from opgraph.engines.triton import loader
from opgraph.runtime.dynamic import DynamicPlan
from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import requires_interpreter

from ..helpers import run_at_shape

pytestmark = requires_interpreter

B, S = og.Dim("batch", 1, 16), og.Dim("seq", 1, 37)
SHAPES = [(1, 1), (1, 2), (2, 1), (2, 3), (3, 5), (5, 7), (7, 13), (13, 31), (16, 17), (11, 2), (16, 37), (1, 37)]


def bias_relu(g):
    x = g.tensor(dim=[B, S, 8], name="x")
    bias = g.tensor(dim=[1, 1, 8], name="bias")
    g.relu(g.add(x, bias)).set_output(True).set_name("y")


def per_batch_scale(g):  # a value broadcast along the dynamic seq axis: coordinates divide by sizes
    x = g.tensor(dim=[B, S, 6], name="x")
    s = g.tensor(dim=[B, 1, 1], name="s")
    r = g.tensor(dim=[B, S, 6], name="r")
    y = g.mul(x, s).set_output(True).set_name("y")
    g.add(y, r).set_output(True).set_name("z")


def per_row_scale(g):  # RMSNorm's scaling: a value per [batch, seq] row, rows packed as the space's
    x = g.tensor(dim=[B, S, 12], name="x")
    ms = g.tensor(dim=[B, S, 1], name="ms")
    w = g.tensor(dim=[1, 1, 12], name="w")
    g.mul(g.mul(x, g.rsqrt(ms)), w).set_output(True).set_name("y")


def wide_rows(g):  # the same in bf16 over rows of 64: every size a multiple of 16 (compiled as such)
    x = g.tensor(dim=[B, S, 64], data_type=og.DataType.BFLOAT16, name="x")
    ms = g.tensor(dim=[B, S, 1], name="ms")
    w = g.tensor(dim=[1, 1, 64], data_type=og.DataType.BFLOAT16, name="w")
    y = g.mul(g.mul(x, g.rsqrt(ms)), w).set_output(True).set_name("y")
    y.set_data_type(og.DataType.BFLOAT16)


def norm_apply_rows(g):  # RMSNorm's scaling over rows of 256: the row walk (ROWS x COLS tiles, rows dynamic)
    x = g.tensor(dim=[B, S, 256], name="x")
    ms = g.tensor(dim=[B, S, 1], name="ms")
    w = g.tensor(dim=[1, 1, 256], name="w")
    g.mul(g.mul(x, g.rsqrt(ms)), w).set_output(True).set_name("y")


def channels_last(g):  # dynamic strides: [8*seq, 1, 8]
    x = g.tensor(dim=[B, 8, S], stride=[8 * S, 1, 8], name="x")
    g.exp(x).set_output(True).set_name("y")


def scaled_half(g):  # a pass-by-value scalar, fp16 in and out, fp32 math
    x = g.tensor(dim=[B, S, 4], data_type=og.DataType.HALF, name="x")
    alpha = g.tensor(dim=[1], stride=[1], data_type=og.DataType.FLOAT, name="alpha", is_pass_by_value=True)
    g.tanh(g.mul(x, alpha)).set_output(True).set_name("y").set_data_type(og.DataType.HALF)


def residual_layernorm(g):  # rownorm: a prologue, the statistics, an epilogue; rows batch*seq
    x = g.tensor(dim=[B, S, 24], name="x")
    r = g.tensor(dim=[B, S, 24], name="r")
    scale = g.tensor(dim=[1, 1, 24], name="scale")
    bias = g.tensor(dim=[1, 1, 24], name="bias")
    y, mean, inv = g.layernorm("training", g.add(x, r), scale, bias, epsilon=1e-5)
    g.relu(y).set_output(True).set_name("y")
    mean.set_output(True).set_name("mean")
    inv.set_output(True).set_name("inv")


def rmsnorm_rows(g):  # rownorm over a transposed-batch layout: rows addressed through dynamic strides
    x = g.tensor(dim=[B, S, 16], stride=[16, 16 * B, 1], name="x")
    scale = g.tensor(dim=[1, 1, 16], name="scale")
    y, _ = g.rmsnorm("inference", x, scale, epsilon=1e-6)
    y.set_output(True).set_name("y")


def row_and_column_sums(g):  # reductions: over a static row (kept rows dynamic), over the dynamic axes
    x = g.tensor(dim=[B, S, 40], name="x")
    y = g.reduction(g.exp(x), mode=og.ReductionMode.ADD).set_output(True).set_name("y")
    y.set_dim([B, S, 1])
    z = g.reduction(x, mode=og.ReductionMode.AVG).set_output(True).set_name("z")
    z.set_dim([1, 1, 40])


def max_over_seq(g):  # a reduction of the middle (dynamic) axis, kept axes dynamic and static
    x = g.tensor(dim=[B, S, 12], name="x")
    m = g.reduction(g.mul(x, x), mode=og.ReductionMode.MAX).set_output(True).set_name("m")
    m.set_dim([B, 1, 12])


def transposed_add(g):  # a transpose read in place
    x = g.tensor(dim=[B, S, 6], name="x")
    r = g.tensor(dim=[B, 6, S], name="r")
    g.add(g.transpose(x, permutation=[0, 2, 1]), r).set_output(True).set_name("y")


def halves(g):  # slices of a static axis of a dynamic tensor, read in place
    x = g.tensor(dim=[B, S, 8], name="x")
    a = g.slice(x, slices=[slice(None), slice(None), slice(0, 4)])
    b = g.slice(x, slices=[slice(None), slice(None), slice(4, 8)])
    g.sub(g.mul(a, b), a).set_output(True).set_name("y")


def transposed_copy(g):  # views alone, copied out
    x = g.tensor(dim=[B, S, 6], name="x")
    g.transpose(x, permutation=[1, 0, 2]).set_output(True).set_name("y")


def rotary(g):  # x * cos + rotate_half(x) * sin: slices and a concatenation of the static head axis
    x = g.tensor(dim=[B, S, 8], name="x")
    cos = g.tensor(dim=[1, S, 8], name="cos")
    sin = g.tensor(dim=[1, S, 8], name="sin")
    x1 = g.slice(x, slices=[slice(None), slice(None), slice(0, 4)])
    x2 = g.slice(x, slices=[slice(None), slice(None), slice(4, 8)])
    rot = g.concatenate([g.neg(x2), x1], axis=2)
    g.add(g.mul(x, cos), g.mul(rot, sin)).set_output(True).set_name("y")


def token_and_position_embeddings(g):  # lookups (indices of the dynamic shape, a static table), fused
    ids = g.tensor(dim=[B, S], data_type=og.DataType.INT64, name="ids")
    pos = g.tensor(dim=[1, S], data_type=og.DataType.INT64, name="pos")
    wte = g.tensor(dim=[50, 8], name="wte")
    wpe = g.tensor(dim=[40, 8], name="wpe")
    g.add(g.embedding(wte, ids), g.embedding(wpe, pos)).set_output(True).set_name("h")


def heads_split(g):  # views alone no strides describe (a reshape by output dims, then a transpose): copied
    x = g.tensor(dim=[B, S, 8], name="x")
    heads = g.reshape(x).set_dim([B, S, 2, 4])
    g.transpose(heads, permutation=[0, 2, 1, 3]).set_output(True).set_name("y")


def unsqueezed(g):  # a reshape by output dims alone, adding axes of size 1: copied
    x = g.tensor(dim=[B, S], name="x")
    g.reshape(x).set_dim([B, 1, S, 1]).set_output(True).set_name("y")


def window_merge(g):  # a transpose of a static slice, its axes merged with a dynamic one: copied
    x = g.tensor(dim=[B, S, 6], name="x")
    half = g.slice(x, slices=[slice(None), slice(None), slice(1, 5)])
    t = g.transpose(half, permutation=[0, 2, 1])
    g.reshape(t).set_dim([B, S * 4]).set_output(True).set_name("y")


def heads_merge(g):  # transposed heads merged back (a transpose, then a reshape by output dims)
    x = g.tensor(dim=[B, 2, S, 4], name="x")
    t = g.transpose(x, permutation=[0, 2, 1, 3])
    g.reshape(t).set_dim([B, S, 8]).set_output(True).set_name("y")


def diff_along_seq(g):  # torch.diff's concatenation along the dynamic axis: a static operand, then a dynamic one
    x = g.tensor(dim=[B, S], name="x")
    first = g.slice(x, slices=[slice(None), slice(0, 1)])
    g.concatenate([g.neg(first), x], axis=1).set_output(True).set_name("y")


def joined_along_seq(g):  # offsets along the dynamic axis that are run-time sizes (seq, seq + 3)
    x = g.tensor(dim=[B, S, 4], name="x")
    r = g.tensor(dim=[B, 3, 4], name="r")
    g.neg(g.concatenate([x, r, g.exp(x)], axis=1)).set_output(True).set_name("y")


def nested_join(g):  # a join along the dynamic axis inside a join along a static one
    x = g.tensor(dim=[B, S, 4], name="x")
    r = g.tensor(dim=[B, 2, 4], name="r")
    seq = g.concatenate([r, x], axis=1)
    z = g.tensor(dim=[B, S + 2, 3], name="z")
    g.relu(g.concatenate([seq, z], axis=2)).set_output(True).set_name("y")


def scan_along_seq(g):  # cumsum of the dynamic axis, a prologue and an epilogue: a dynamic chunk count
    x = g.tensor(dim=[B, S, 4], name="x")
    r = g.tensor(dim=[B, S, 4], name="r")
    c = g.cumsum(g.mul(x, x), 1, name="cumsum")
    g.add(c, r).set_output(True).set_name("y")


def reverse_scan_along_seq(g):  # the reverse walk from a run-time chunk count; rows static and dynamic
    x = g.tensor(dim=[B, 3, S], name="x")
    scale = g.tensor(dim=[1, 3, 1], name="scale")
    c = g.cumsum(g.neg(x), 2, reverse=True, name="cumsum")
    g.mul(c, scale).set_output(True).set_name("y")


def reverse_scan_of_rows(g):  # a static scanned axis, dynamic rows read through dynamic strides
    x = g.tensor(dim=[B, S, 6], stride=[6, 6 * B, 1], name="x")
    c = g.cumsum(g.exp(x), 2, reverse=True, name="cumsum")
    g.sub(c, x).set_output(True).set_name("y")


def position_ids(g):  # RoBERTa's: cumsum(ids != pad) * (ids != pad) + pad, int64
    ids = g.tensor(dim=[B, S], data_type=og.DataType.INT64, name="ids")
    ne = g.cmp_neq(ids, 1, name="ne").set_data_type(og.DataType.BOOLEAN)
    mask = g.identity(ne, name="mask").set_data_type(og.DataType.INT32)
    count = g.cumsum(mask, 1, name="cumsum").set_data_type(og.DataType.INT64)
    g.add(g.mul(count, mask), 1).set_output(True).set_name("positions").set_data_type(og.DataType.INT64)


GRAPHS = {
    f.__name__: f
    for f in (
        bias_relu,
        per_batch_scale,
        per_row_scale,
        wide_rows,
        norm_apply_rows,
        channels_last,
        scaled_half,
        residual_layernorm,
        rmsnorm_rows,
        row_and_column_sums,
        max_over_seq,
        transposed_add,
        halves,
        transposed_copy,
        rotary,
        token_and_position_embeddings,
        heads_split,
        unsqueezed,
        window_merge,
        heads_merge,
        diff_along_seq,
        joined_along_seq,
        nested_join,
        scan_along_seq,
        reverse_scan_along_seq,
        reverse_scan_of_rows,
        position_ids,
    )
}


def graph_of(make) -> og.Graph:
    g = og.Graph(make.__name__, io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    make(g)
    return g


def run_at(plan: DynamicPlan, env: dict, rng: np.random.Generator) -> None:
    run_at_shape(plan, env, rng)


def env_of(b: int, s: int) -> dict[str, int]:
    return {"batch": b, "seq": s}


def shapes(seed: int = 0) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return SHAPES + [(int(rng.integers(1, 17)), int(rng.integers(1, 38))) for _ in range(6)]


@pytest.mark.parametrize("name", list(GRAPHS))
def test_one_kernel_per_bucket_serves_every_shape(name, monkeypatch):
    loads = []
    real = loader._load
    monkeypatch.setattr(loader, "_load", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    g = graph_of(GRAPHS[name])
    plan = g.build(device="cpu", engines=["triton"])
    assert isinstance(plan, DynamicPlan)
    rng = np.random.default_rng(3)
    kernels: dict[tuple[int, int], set] = {}
    for b, s in shapes():
        run_at(plan, env_of(b, s), rng)
        at = plan.at(env_of(b, s))
        for i, step in enumerate(at.steps):
            assert step.config.engine == "triton"
            source = at.source(i)
            assert "_OG_SIZES" in source  # sizes are run-time arguments
            kernels.setdefault((plan.buckets.of((b, s)).index, i), set()).add((source, step.config.knobs))
    assert all(len(k) == 1 for k in kernels.values()), kernels  # one kernel a bucket and step, whatever the shape
    assert plan.stats["shape_kernels"] == 0 and plan.stats["shape_builds"] == 0  # every step re-pointed
    assert plan.stats["kernels"] == len({k for ks in kernels.values() for k in ks})
    assert len(set(loads)) == len(loads) <= len(kernels)  # a generated module loaded once per source
    for b, s in shapes(seed=1):  # more shapes of the buckets already used: nothing new
        run_at(plan, env_of(b, s), rng)
    assert plan.stats["shape_kernels"] == 0 and len(set(loads)) == len(loads)


def test_a_per_row_value_is_addressed_by_one_division():
    """The rows [batch, seq] of a per-row value are packed as the space's: one coordinate (lin // 12) reads
    it, not a division and a remainder by the run-time sizes per element; the per-batch scale's axis
    stays apart (its stride along seq is 0)."""
    source = graph_of(per_row_scale).build(device="cpu", engines=["triton"], buckets="one").at(env_of(3, 5)).source(0)
    assert "r0_1 = (lin // 12)" in source and "% sz" not in source and "// sz" not in source
    source = graph_of(per_batch_scale).build(device="cpu", engines=["triton"], buckets="one").at(env_of(3, 5)).source(0)
    assert "r0_1" not in source and "c0 = (lin // sz" in source


def test_the_row_walk_takes_its_row_count_at_run_time():
    """RMSNorm's scaling over rows of 256 in a bucket whose hint has enough rows: ROWS x COLS tiles, each
    row's value loaded once a row, the row count and the batch run-time sizes, the columns literal; one
    source for every shape of the bucket, each against the reference engine."""
    from ..helpers import check_one_sized_kernel

    plan = graph_of(norm_apply_rows).build(device="cpu", engines=["triton"], buckets="one")
    at = plan.at(env_of(3, 5))
    assert at.steps[0].config.knob("ROWS") is not None and at.steps[0].config.knob("COLS") == 256
    source = at.source(0)
    assert "c2 = pid_j * 256 + tl.arange(0, 256)[None, :]" in source and "mask_i = c1 < sz" in source
    check_one_sized_kernel(plan, [env_of(b, s) for b, s in shapes()], np.random.default_rng(5), "pointwise", run=run_at)


def test_a_bucket_compiles_at_its_first_shape_only():
    plan = graph_of(bias_relu).build(device="cpu", engines=["triton"], buckets="one")
    assert len(plan.buckets) == 1
    rng = np.random.default_rng(4)
    for b, s in SHAPES:
        run_at(plan, env_of(b, s), rng)
    assert plan.stats["kernels"] == 1 and plan.stats["runtime_compiles"] == 0  # the build's kernel serves all
    assert plan.stats["shape_plans"] == len(SHAPES)


def test_an_unconverted_piece_is_a_kernel_per_shape_and_counted():
    g = og.Graph("conv", io_data_type=og.DataType.FLOAT)
    x, w = g.tensor(dim=[B, 4, 6, 6], name="x"), g.tensor(dim=[8, 4, 3, 3], name="w")
    g.conv_fprop(image=x, weight=w, padding=[1, 1]).set_output(True).set_name("y")  # (the conv template bakes sizes in)
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(5)
    for b, s in [(2, 3), (3, 5), (2, 3)]:
        run_at(plan, env_of(b, s), rng)
    assert plan.stats["shape_kernels"] == 2  # (the range's maximum was built at build)
    assert plan.stats["shape_builds"] == plan.stats["shape_plans"] == 3  # (the maximum too): one step each
    assert "2 of them per shape" in plan.describe()


@pytest.mark.parametrize("engine", ["reference", "torch", "library"])
def test_library_torch_and_reference_kernels_are_re_pointed_at_a_new_shape(engine, monkeypatch):
    """PyTorch reads the sizes at run time and the library engine's generated epilogue takes them at run
    time: a new shape of a bucket builds nothing, whichever engine ran the bucket, and runs right."""
    g = og.Graph("mm", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x, w = g.tensor(dim=[B, S, 8], name="x"), g.tensor(dim=[1, 8, 4], name="w")
    b = g.tensor(dim=[1, 1, 4], name="b")
    g.relu(g.add(g.matmul(x, w), b)).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=[engine], buckets="one")
    rng = np.random.default_rng(9)
    run_at(plan, env_of(2, 3), rng)
    generated = []
    triton = get_engine("triton")
    real = triton.compile
    monkeypatch.setattr(triton, "compile", lambda *a, **k: generated.append(a) or real(*a, **k))
    for b_, s_ in [(3, 5), (16, 37), (1, 1), (7, 13)]:
        run_at(plan, env_of(b_, s_), rng)
    steps = plan.at(env_of(7, 13)).steps
    assert {st.config.engine for st in steps} == {engine}
    assert plan.stats["shape_builds"] == 0 and plan.stats["rechosen"] == 0
    assert all(st.kernel.repointed for st in steps)
    assert not generated  # (the library engine's epilogue: not generated again)


def test_a_re_pointed_kernel_makes_its_jit_launchers_only_when_asked():
    """A bound plan on CUDA launches binaries natively and reads only the grids: the copy of a bucket
    kernel at each new shape makes no Triton JIT launchers unless something (the interpreter) asks."""
    plan = graph_of(bias_relu).build(device="cpu", engines=["triton"], buckets="one")
    run_at(plan, env_of(2, 3), np.random.default_rng(11))
    kernel = plan.at(env_of(7, 13)).steps[0].kernel
    assert kernel.repointed and "launchers" not in vars(kernel)
    grids = [kernel.grid(i) for i in range(len(kernel.generated.launches))]
    assert all(len(g) == 3 for g in grids) and grids[0][: len(kernel.generated.launches[0].grid)] == tuple(
        kernel.generated.launches[0].grid
    )
    assert [launcher.grid for launcher in kernel.launchers] == grids  # (made now, this shape's)


@pytest.mark.parametrize("engine", ["triton", "torch", "reference"])
def test_a_dropped_shape_plan_is_freed_without_the_garbage_collector(engine):
    """A serving loop drops a per-shape plan at almost every request: with no reference cycle in it
    (launchers holding their own methods, a bound plan and its graph), it is freed when dropped, not
    left to the collector's full passes over the process's heap."""
    import gc
    import weakref

    plan = graph_of(bias_relu).build(device="cpu", engines=[engine], shape_plans=1)
    rng = np.random.default_rng(10)
    run_at(plan, env_of(2, 3), rng)
    at = plan.at(env_of(2, 3))
    dropped = [weakref.ref(at), *(weakref.ref(step.kernel) for step in at.steps)]  # (the launchers hold these)
    del at
    gc.collect()
    gc.disable()
    try:
        run_at(plan, env_of(3, 5), rng)  # (the LRU keeps one shape: batch 2 x seq 3 is dropped)
        assert [ref() for ref in dropped] == [None] * len(dropped)
    finally:
        gc.enable()


def test_an_execute_at_a_seen_shape_builds_nothing(monkeypatch):
    g = graph_of(per_batch_scale)
    plan = g.build(device="cpu", engines=["triton"])
    rng = np.random.default_rng(6)
    seen = [(1, 1), (3, 5), (16, 37)]
    for b, s in seen:
        run_at(plan, env_of(b, s), rng)
    packs = {}
    for b, s in seen:
        static = g.final.at(env_of(b, s))
        packs[(b, s)] = (static, random_pack(static, rng))

    def refuse(*args, **kwargs):
        raise AssertionError("build work on the hot path")

    import opgraph.runtime.dynamic as dynamic
    import opgraph.runtime.plan as plan_module

    monkeypatch.setattr(plan_module, "build_plan", refuse)
    monkeypatch.setattr(dynamic, "solve", refuse)
    monkeypatch.setattr(og.FinalGraph, "in_bucket", refuse)
    monkeypatch.setattr(og.FinalGraph, "at", refuse)
    for _ in range(2):
        for _static, pack in packs.values():
            plan.execute(pack)
    monkeypatch.undo()
    for static, pack in packs.values():
        want = reference_outputs(static, pack)
        assert all(compare(static.tensors[u], pack[u], want[u]) is None for u in static.outputs)


def test_describe_and_the_log_name_buckets_and_new_kernels(caplog):
    plan = graph_of(bias_relu).build(device="cpu", engines=["triton"], buckets={"seq": [8]}, max_buckets=8)
    rng = np.random.default_rng(7)
    with caplog.at_level(logging.INFO, logger="opgraph.dynamic"):
        run_at(plan, env_of(3, 5), rng)
        run_at(plan, env_of(4, 6), rng)
    text = caplog.text
    assert "plan 'bias_relu' bucket 2 (batch 2..16, seq 1..8 (hint batch=6 seq=3)) first used at batch=3 seq=5" in text
    assert "plan 'bias_relu' step 0 (triton pointwise): new kernel for batch=3 seq=5 (bucket 2)" in text
    assert "batch=4 seq=6" in text and text.count("new kernel") == 1  # the second shape compiled nothing
    lines = plan.describe().splitlines()
    assert lines[2].startswith("  buckets: 4 (build(buckets=(('seq', (8,)),), max_buckets=8)); kernels 2, 1 met")
    assert (
        lines[3] == "    bucket 0: batch 1, seq 1..8 (hint batch=1 seq=3): not used yet (compiles at its first shape)"
    )
    assert lines[5] == (
        "    bucket 2: batch 2..16, seq 1..8 (hint batch=6 seq=3): first used at batch=3 seq=5; "
        "2 shape(s) planned, 1 kernel(s)"
    )
    assert lines[6].startswith(
        "    bucket 3: batch 2..16, seq 9..37 (hint batch=6 seq=16): first used at batch=16 seq=37 (at build)"
    )


def test_a_view_copy_from_a_dynamic_slice_start_is_one_kernel_per_bucket():
    """The last 4 positions of the length (a slice starting at seq - 4), transposed and merged: a view
    copy whose source offset is a run-time size."""
    seq = og.Dim("seq", 5, 37)
    g = og.Graph("tail", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B, seq, 6], name="x")
    tail = g.transpose(g.slice(x, slices=[slice(None), slice(seq - 4, seq)]), permutation=[0, 2, 1])
    g.reshape(tail).set_dim([B, 24]).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"])
    rng = np.random.default_rng(8)
    for b, s in [(1, 5), (2, 7), (16, 37), (3, 23), (1, 37), (13, 5)]:
        run_at(plan, env_of(b, s), rng)
        assert "_OG_SIZES" in plan.at(env_of(b, s)).source(0)
    assert plan.stats["shape_kernels"] == 0


def test_the_tiny_llamas_pointwise_steps_take_their_sizes_at_run_time():
    """transformers' tiny Llama (fp32) imported with a dynamic batch and length: its view copies (heads
    split and merged, unsqueezes), reshapes of computed values and torch.diff's concatenation along the
    length, its position ids' scan and its attention (causal, its mask read by the score modifier) are
    one kernel per bucket (none generated per shape), and the
    plan matches the model at 1, primes and the range's ends (outputs poisoned)."""
    import math

    import torch
    from torch.export import Dim

    from tests.frontends.test_torch_import_dynamic import _tiny_lm

    model = _tiny_lm("llama").float()
    dims = {0: Dim("batch", min=1, max=4), 1: Dim("seq", min=17, max=64)}
    imported = og.from_torch(model, (torch.randint(0, 64, (2, 18)),), dynamic_shapes=(dims,))
    plan = imported.plan("cpu", engines=["triton", "torch"])
    torch.manual_seed(1)
    for b, s in [(1, 17), (3, 23), (4, 64), (2, 31)]:
        ids = torch.randint(0, 64, (b, s))
        pack = imported.variant_pack(ids)
        for t in imported.outputs:
            pack[t.known_uid()].fill_(math.nan)
        plan.execute(pack)
        with torch.no_grad():
            want = model(ids)
        torch.testing.assert_close(imported.unpack(pack), want, rtol=1e-4, atol=1e-5)
        steps = plan.at({"batch": b, "seq": s}).steps
        pointwise = [st for st in steps if st.config.knob("template") == "pointwise"]
        assert len(pointwise) >= 10  # (reshapes of computed values and the concatenation among them)
        # the heads' reshapes (no dims of their own: the output's dynamic ones) are read in place by
        # their consumers, not copied alone as they were before
        alone = [st.piece.label() for st in pointwise if {n.kind for n in st.piece.nodes} == {"reshape"}]
        assert len(alone) <= 2, alone
        per_shape = [st.piece.label() for st in pointwise if not st.kernel.generated.sized]
        assert not per_shape, per_shape
        scans = [st for st in steps if st.config.knob("template") == "scan"]
        assert scans and all(st.kernel.generated.sized for st in scans)  # (the position ids)
        attention = [st for st in steps if st.config.knob("template") == "attention"]
        assert len(attention) == 2 and all(st.kernel.generated.sized for st in attention)


def test_sizes_that_are_multiples_of_16_are_compiled_as_such():
    """A run-time size whose every value is a multiple of 16 (the element count of [batch, seq, 64]) is
    specialised as one (tt.divisibility, as a pointer is): the masks and strides it spells let Triton
    vectorise the accesses, as a literal size does; a size of no such divisor ([batch, seq, 12]'s) is not."""
    from opgraph.core.device import Device
    from opgraph.engines.triton import TritonKernel

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    found = set()
    for width in (64, 12):
        g = og.Graph("per_batch", io_data_type=og.DataType.BFLOAT16, compute_data_type=og.DataType.FLOAT)
        x, s = g.tensor(dim=[B, S, width], name="x"), g.tensor(dim=[B, 1, 1], name="s")
        g.mul(x, s).set_output(True).set_name("y")
        kernel = g.build(device="cpu", engines=["triton"], buckets="one").at(env_of(3, 5)).steps[0].kernel
        gpu = TritonKernel(kernel.piece, kernel.config, kernel.generated, interpret=False, device=h200)
        (launch,) = gpu.generated.launches
        spec = gpu.spec(0)
        assert spec is not None
        for i, a in enumerate(launch.args):
            if a.kind == "size":
                assert (i in spec.aligned) == (width == 64), (width, a)
                found.add(i in spec.aligned)
    assert found == {True, False}
