"""The matmul template in dynamic plans (templates/matmul.py, sizes.py): a piece of a bucket whose
dynamic sizes are M or batch dims gets one kernel taking them at run time (size arguments, the grid
per shape), re-pointed at every shape of the bucket, never generated again; configs whose structure
depends on the shape (split-K) are generated at each shape. Each graph is built once and run at 1,
primes and the range's ends against the reference engine, on random inputs, outputs poisoned."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.engines.triton.templates.matmul import MatmulMatch
from opgraph.memory.workspace import align_up
from opgraph.runtime.dynamic import DynamicPlan

from ..helpers import check_one_sized_kernel, check_re_pointed, requires_cuda, requires_interpreter, run_at_shape

pytestmark = pytest.mark.interpreter
DT = og.DataType
T = og.Dim("tokens", 1, 67)
B, S = og.Dim("batch", 1, 9), og.Dim("seq", 1, 37)
TOKENS = [{"tokens": t} for t in (1, 2, 3, 17, 31, 64, 67)]
BATCH_SEQ = [{"batch": b, "seq": s} for b, s in ((1, 1), (1, 37), (2, 17), (3, 19), (9, 37), (7, 29), (5, 1))]


def _graph(dt: og.DataType, name: str) -> og.Graph:
    return og.Graph(name, io_data_type=dt, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)


def linear(dt: og.DataType) -> og.Graph:
    """x [tokens, 48] @ w [48, 40]: M dynamic."""
    g = _graph(dt, "linear")
    x, w = g.tensor(dim=[T, 48], name="x"), g.tensor(dim=[48, 40], name="w")
    g.matmul(x, w).set_output(True).set_name("y")
    return g


def linear_bias_gelu(dt: og.DataType) -> og.Graph:
    """gelu(x [batch, seq, 32] @ w [1, 32, 24] + bias): a batch axis and M dynamic, an epilogue."""
    g = _graph(dt, "linear_bias_gelu")
    x, w = g.tensor(dim=[B, S, 32], name="x"), g.tensor(dim=[1, 32, 24], name="w")
    bias = g.tensor(dim=[1, 1, 24], name="bias")
    g.gelu(g.add(g.matmul(x, w), bias)).set_output(True).set_name("y")
    return g


def batched(dt: og.DataType) -> og.Graph:
    """q [batch, seq, 16] @ k^T [batch, 16, seq]: a dynamic batch, M and N, the transposed operand read
    in place (its strides set by seq), scaled in the epilogue."""
    g = _graph(dt, "batched")
    q, k = g.tensor(dim=[B, S, 16], name="q"), g.tensor(dim=[B, S, 16], name="k")
    scores = g.matmul(q, g.transpose(k, [0, 2, 1]))
    g.mul(scores, g.tensor(dim=[1, 1, 1], name="scale")).set_output(True).set_name("y")
    return g


def run_at(plan: DynamicPlan, env: dict[str, int], rng: np.random.Generator) -> None:
    # (relative to the output's scale: an element near zero is a sum of large products)
    run_at_shape(plan, env, rng, relative_to_scale=True)


def matmul_steps(plan):
    return [s for s in plan.steps if s.config.knob("template") == "matmul"]


CASES = [
    pytest.param(linear, TOKENS, id="linear"),
    pytest.param(linear_bias_gelu, BATCH_SEQ, id="linear_bias_gelu"),
    pytest.param(batched, BATCH_SEQ, id="batched"),
]


@requires_interpreter
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16, DT.HALF], ids=lambda d: d.name)
@pytest.mark.parametrize("make,shapes", CASES)
def test_one_matmul_kernel_takes_every_shape_of_the_bucket(make, shapes, dt):
    plan = make(dt).build(device="cpu", engines=["triton"], buckets="one")
    assert isinstance(plan, DynamicPlan)
    check_one_sized_kernel(plan, shapes, np.random.default_rng(0), "matmul", run=run_at)


@requires_interpreter
@pytest.mark.parametrize("make,shapes", CASES[1:])
def test_a_new_shape_re_points_the_matmul_instead_of_generating_it(make, shapes, monkeypatch):
    plan = make(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    check_re_pointed(plan, shapes, np.random.default_rng(1), "matmul", monkeypatch, run=run_at)


def _forced(monkeypatch, **knobs):
    """The matmul's candidates all with `knobs` (the bucket's plan takes the first)."""
    real = MatmulMatch.candidates
    monkeypatch.setattr(MatmulMatch, "candidates", lambda self: [c.replace(**knobs) for c in real(self)])


@requires_interpreter
def test_a_persistent_grid_is_the_same_at_every_shape(monkeypatch):
    _forced(monkeypatch, PERSISTENT=3)
    plan = linear_bias_gelu(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(2)
    for env in BATCH_SEQ:
        run_at(plan, env, rng)
        (step,) = matmul_steps(plan.at(env))
        assert step.kernel.generated.sized and step.kernel.generated.launches[0].grid == (3,)
        assert "for work in tl.range(tl.program_id(0), sz" in step.kernel.generated.source


@requires_interpreter
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("make,shapes", CASES)
def test_split_k_is_in_the_bucket_kernel(make, shapes, dt, monkeypatch):
    """Split-K's partials laid out for the bucket's largest shape, indexed by the run-time M (and batch
    programs, where the batch is dynamic): the main launch and the launch that sums the slices take the
    sizes, one source for every shape."""
    _forced(monkeypatch, SPLIT_K=2, BLOCK_K=16)
    plan = make(dt).build(device="cpu", engines=["triton"], buckets="one")
    check_one_sized_kernel(plan, shapes, np.random.default_rng(3), "matmul", run=run_at)
    for env in shapes:
        (step,) = matmul_steps(plan.at(env))
        gen = step.kernel.generated
        assert step.config.knob("SPLIT_K") == 2 and [l.kernel for l in gen.launches] == ["kernel", "kernel_epilogue"]
        assert gen.bucket_scratch
        if make is linear:
            assert gen.scratch_bytes == align_up(2 * 67 * 40 * 4)  # (2 slices x 67 x 40 fp32)


def test_a_split_config_whose_kernel_is_generated_at_each_shape_is_no_tile_variant():
    """A column reduction of the product over a dynamic M (a sum over the rows) makes its kernels at each
    shape: the configs a bucket's step may switch to at a shape (`focused`, tile variants) leave its split
    configs out, as they would be chosen and compiled again at each shape; their kernels are not sized."""
    from opgraph.build.buckets import choose
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    batch, seq = og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)
    g = _graph(DT.BFLOAT16, "colsum")
    x = g.tensor(dim=[batch, seq, 2816], name="x")
    w = g.tensor(dim=[1, 2816, 1024], stride=[2816 << 10, 1, 2816], name="w")
    g.reduction(g.matmul(x, w), mode="ADD").set_output(True).set_dim([1, 1, 1024])
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(hint, 0, hint.nodes)
    match = TEMPLATE.matched(piece, h200)
    assert isinstance(match, MatmulMatch) and match.bucket is not None
    plain = dict(TMA=None, TMA_HOST=None, PERSISTENT=None, FLATTEN=None, EPILOGUE_SUBTILE=None)
    split = [match.candidates()[0].replace(BLOCK_M=64, BLOCK_N=32, SPLIT_K=s, **plain) for s in (2, 4)]
    assert all(not match.kernels(c).sized and not match.one_kernel(c) for c in split)
    for env in ({"batch": 2, "seq": 17}, {"batch": 3, "seq": 20}):
        focused = match.focused(env)
        assert focused is not None
        assert all(c.split_k == 1 for c in focused.candidates()[:-1])


@requires_interpreter
def test_split_k_with_a_row_reduction_across_programs_is_in_the_bucket_kernel(monkeypatch):
    """The Llama's down projection at a short request: split-K, the residual, the next RMSNorm's mean of
    squares over column tiles (the launch summing the slices writes the reduction's partials, a third launch
    combines them), all three launches taking the run-time sizes."""
    _forced(monkeypatch, SPLIT_K=3, BLOCK_K=16, BLOCK_M=16, BLOCK_N=16)
    g = _graph(DT.FLOAT, "split_row_sum")
    x, w = g.tensor(dim=[B, S, 48], name="x"), g.tensor(dim=[1, 48, 40], name="w")
    h = g.add(g.matmul(x, w), g.tensor(dim=[B, S, 40], name="residual"))
    h.set_output(True).set_name("h")
    g.reduction(g.mul(h, h), mode="AVG").set_output(True).set_dim([B, S, 1]).set_name("ms")
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    check_one_sized_kernel(plan, BATCH_SEQ, np.random.default_rng(9), "matmul", run=run_at)
    (step,) = matmul_steps(plan.at(BATCH_SEQ[0]))
    launches = [l.kernel for l in step.kernel.generated.launches]
    assert launches == ["kernel", "kernel_epilogue", "kernel_combine0"]


@requires_interpreter
def test_split_k_whose_partials_outgrow_the_cap_is_generated_at_each_shape(monkeypatch):
    from opgraph.engines.triton.templates import matmul

    _forced(monkeypatch, SPLIT_K=2, BLOCK_K=16)
    monkeypatch.setattr(matmul, "SPLIT_PARTIALS_BYTES", 2 * 66 * 40 * 4)  # (one row short of the bucket's)
    plan = linear(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(3)
    for env in TOKENS[:4]:
        run_at(plan, env, rng)
        (step,) = matmul_steps(plan.at(env))
        assert step.config.knob("SPLIT_K") == 2 and not step.kernel.generated.sized


@requires_interpreter
@pytest.mark.parametrize("mode", ["ADD", "AVG", "MAX"])
def test_a_row_reduction_one_program_holds_is_in_the_bucket_kernel(mode):
    """The sum of squares of a projection (RMSNorm's statistics after it: N <= BLOCK_N, one program a row)."""
    g = _graph(DT.FLOAT, "row_sum")
    x, w = g.tensor(dim=[B, S, 32], name="x"), g.tensor(dim=[1, 32, 24], name="w")
    y = g.matmul(x, w)
    y.set_output(True).set_name("y")
    g.reduction(g.mul(y, y), mode=mode).set_output(True).set_dim([B, S, 1]).set_name("ss")
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(4)
    for env in BATCH_SEQ:
        run_at(plan, env, rng)
        (step,) = matmul_steps(plan.at(env))
        assert step.kernel.generated.sized and len(step.kernel.generated.launches) == 1


@requires_interpreter
@pytest.mark.parametrize("mode", ["ADD", "AVG", "MAX"])
@pytest.mark.parametrize("hopper", [False, True], ids=["pointer", "host_descriptors"])
def test_a_row_reduction_across_programs_is_in_the_bucket_kernel(mode, hopper, monkeypatch):
    """A Llama block's output projection with the residual and the next RMSNorm's mean of squares (N 40
    over tiles of 16 columns: partials per column tile, a combine launch): the partials are laid out for
    the bucket's largest M and both launches take the run-time sizes; one module for every shape; with
    host descriptors too (the Hopper path)."""
    _forced(monkeypatch, **(HOPPER if hopper else {"BLOCK_N": 16, "BLOCK_M": 16}))
    g = _graph(DT.FLOAT, "row_sum_tiles")
    x, w = g.tensor(dim=[B, S, 32], name="x"), g.tensor(dim=[1, 32, 40], name="w")
    h = g.add(g.matmul(x, w), g.tensor(dim=[B, S, 40], name="residual"))
    h.set_output(True).set_name("h")
    g.reduction(g.mul(h, h), mode=mode).set_output(True).set_dim([B, S, 1]).set_name("ms")
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    check_one_sized_kernel(plan, BATCH_SEQ, np.random.default_rng(8), "matmul", run=run_at)
    scratch = set()
    for env in BATCH_SEQ:
        gen = matmul_steps(plan.at(env))[0].kernel.generated
        assert [l.kernel for l in gen.launches] == ["kernel", "kernel_combine0"] and gen.bucket_scratch
        scratch.add(gen.scratch_bytes)
    tiles = -(-40 // (HOPPER["BLOCK_N"] if hopper else 16))
    assert scratch == {align_up(tiles * 9 * 37 * 4)}  # column tiles x the bucket's largest batch x seq


@requires_interpreter
def test_a_column_reduction_over_a_dynamic_m_is_generated_at_each_shape():
    g = _graph(DT.FLOAT, "col_sum")
    x, w = g.tensor(dim=[T, 48], name="x"), g.tensor(dim=[48, 24], name="w")
    g.reduction(g.matmul(x, w), mode="ADD").set_output(True).set_dim([1, 24]).set_name("y")
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    rng = np.random.default_rng(5)
    fused = 0
    for env in TOKENS:
        run_at(plan, env, rng)
        for step in matmul_steps(plan.at(env)):  # (at 1 token the reduction reduces nothing: planned apart)
            if "reduction" in step.piece.kind_set:
                fused += 1
                assert not step.kernel.generated.sized
    assert fused >= len(TOKENS) - 1


@requires_interpreter
def test_a_bucket_kernel_source_does_not_depend_on_what_was_generated_before():
    """Each config's size parameters are its own, named in the order it uses them (one spec key per
    config, whichever configs the build generated first)."""
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    plan = linear_bias_gelu(DT.FLOAT).build(device="cpu", engines=["triton"], buckets="one")
    (step,) = matmul_steps(plan.at({"batch": 3, "seq": 19}))
    cpu = Device("cpu", 0, "cpu", (0, 0), 1)
    a, b = ({**dict(step.config.knobs), "BLOCK_M": m} for m in (16, 32))
    a.pop("template"), b.pop("template")
    match = TEMPLATE.matched(step.piece, cpu)
    first = match.generate(match.knobs(a))
    other = match.generate(match.knobs(b))
    again = match.generate(match.knobs(a))
    assert first.sized and other.sized and first.source == again.source
    sizes = [a for a in other.launches[0].args if a.kind == "size"]
    assert f"_OG_SIZES = {tuple(f'sz{i}' for i in range(len(sizes)))!r}" in other.source


@requires_interpreter
def test_static_plans_keep_literal_sizes():
    g = _graph(DT.FLOAT, "static")
    x, w = g.tensor(dim=[5, 48], name="x"), g.tensor(dim=[48, 40], name="w")
    g.matmul(x, w).set_output(True)
    plan = g.build(device="cpu", engines=["triton"])
    gen = plan.steps[0].kernel.generated
    assert not gen.sized and "_OG_SIZES" not in gen.source and "rmask = rm < 5" in gen.source


# -- Hopper: the sized kernel compiles (ptxas, sm_90) ---------------------------------------------------------


def _mlp_up_piece():
    """GPT-2's MLP up-projection over a dynamic batch (1..16) and sequence (1..2048), bf16: the piece at
    the shape 3 x 517 of the bucket that holds the whole range."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    batch, seq = og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)
    g = og.Graph("mlp_up_dynamic", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[batch, seq, 768], name="a"), g.tensor(dim=[1, 768, 3072], name="b")
    bias = g.tensor(dim=[1, 1, 3072], name="bias")
    g.gelu_approx_tanh(g.add(g.matmul(a, b), bias)).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    static = final.in_bucket({"batch": 3, "seq": 517}, bucket)
    return make_piece(static, 0, static.nodes)


def _oproj_rms_piece():
    """A Llama block's output projection (d 1024) with the residual and the next RMSNorm's mean of
    squares, over a dynamic batch and sequence, bf16: the row reduction spans the column tiles."""
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece

    batch, seq = og.Dim("batch", 1, 16), og.Dim("seq", 1, 2048)
    g = og.Graph("oproj_rms_dynamic", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a, b = g.tensor(dim=[batch, seq, 1024], name="a"), g.tensor(dim=[1, 1024, 1024], name="b")
    h = g.add(g.matmul(a, b), g.tensor(dim=[batch, seq, 1024], name="residual"))
    h.set_output(True)
    g.reduction(g.mul(h, h), mode="AVG").set_output(True).set_dim([batch, seq, 1]).set_data_type(DT.FLOAT)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    static = final.in_bucket({"batch": 3, "seq": 517}, bucket)
    return make_piece(static, 0, static.nodes)


def _pointer_configs(cands):
    """The best two configs without TMA or split-K (the ones that take their sizes at run time)."""
    return [c for c in cands if not c.get("TMA") and not c.get("TMA_HOST") and c.get("SPLIT_K", 1) == 1][:2]


def _host_configs(cands):
    """The heuristic's first config on Hopper: host descriptors, persistent, flattened (a bucket kernel too)."""
    return [c for c in cands if c.get("TMA_HOST")][:1]


HOPPER_CASES = {
    "mlp_up_dynamic": (_mlp_up_piece, "matmul", _pointer_configs),
    "mlp_up_dynamic_host": (_mlp_up_piece, "matmul", _host_configs),
    "oproj_rms_dynamic_host": (_oproj_rms_piece, "matmul", _host_configs),
}


@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16], ids=lambda d: d.name)
def test_a_buckets_matmul_ranks_one_kernel_for_the_bucket_first(dt):
    """A Llama block's output projection over batch 1..8 x seq 1..512 (hint 3 x 16: M 48) on an H100: the
    configs of one kernel for the bucket come first, unsplit versions of the split ones among them. At the
    hint's M the estimate ranks split-K first in fp32; that kernel was generated and compiled again at
    every shape (M 1 to 4096), split at every one (an H200's GPU tier caught it)."""
    from opgraph.build.buckets import choose
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    batch, seq = og.Dim("batch", 1, 8), og.Dim("seq", 1, 512)
    g = _graph(dt, "oproj")
    # (x seq-major, [seq, batch, d] in memory: its batch and rows do not nest, so the rows stay per batch
    # entry; a batch-major x folds into one GEMM of batch x seq rows: test_triton_matmul_fold.py)
    x = g.tensor(dim=[batch, seq, 1024], stride=[1024, batch * 1024, 1], name="x")
    w = g.tensor(dim=[1, 1024, 1024], name="w")
    g.add(g.matmul(x, w), g.tensor(dim=[batch, seq, 1024], name="residual")).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    static = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(static, 0, static.nodes)
    cands = TEMPLATE.candidates(piece, h100)
    one_kernel = [bool(c.get("SPLIT_K", 1) == 1 and (not c.get("TMA") or c.get("TMA_HOST"))) for c in cands]
    ranked = one_kernel[:-1]  # (the last: the template's plain fallback, always last)
    assert ranked[0] and ranked == sorted(ranked, reverse=True)  # (one kernel's configs first, then the rest)
    assert TEMPLATE.generate(piece, cands[0], h100).sized
    # (a static piece of the same shape keeps the estimate's order: split-K first, 16 rows a batch entry
    # read through pointers)
    at_shape = make_piece(final.at(bucket.hint_map), 0, final.at(bucket.hint_map).nodes)
    assert TEMPLATE.candidates(at_shape, h100)[0].get("SPLIT_K", 1) == 4


def test_sized_kernels_compile_for_hopper():
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    from .hopper_compile import compile_for_hopper

    h100 = Device("cuda", 0, "H100", (9, 0), 132)
    piece = _mlp_up_piece()
    cands = TEMPLATE.candidates(piece, h100)
    assert cands[0].get("TMA_HOST")  # (the heuristic's first on Hopper)
    for k in _pointer_configs(cands) + _host_configs(cands):
        gen = TEMPLATE.generate(piece, k, h100)
        assert gen.sized and [a.dtype for a in gen.launches[0].args if a.kind == "size"], k
    rms = _oproj_rms_piece()
    (host,) = _host_configs(TEMPLATE.candidates(rms, h100))
    gen = TEMPLATE.generate(rms, host, h100)  # (the mean of squares: partials and a combine launch)
    assert gen.sized and gen.bucket_scratch and [l.kernel for l in gen.launches] == ["kernel", "kernel_combine0"]
    lines = [line.split() for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert len(lines) == 5 and all(w[6] == "0" for w in lines), lines  # no spills
    for w in lines:
        if w[2] == "kernel_combine0":
            continue
        if w[1] == "mlp_up_dynamic":  # 16-byte copies and stores, as the static kernel's (a stride's divisor
            assert int(w[w.index("cp.async") + 1]) > 0 and int(w[w.index("st.v4") + 1]) > 0, w  # in the source)
        else:  # the operands through TMA copies, as the static kernel's
            assert int(w[w.index("tma") + 1]) > 0, w


# -- on the GPU: realistic sizes, the heuristic's configs and the pointer (sized) configs --------------------


def gpu_mlp(dt: og.DataType) -> og.Graph:
    batch, seq = og.Dim("batch", 1, 8), og.Dim("seq", 1, 512)
    g = _graph(dt, "gpu_mlp")
    x, w = g.tensor(dim=[batch, seq, 256], name="x"), g.tensor(dim=[1, 256, 512], name="w")
    bias = g.tensor(dim=[1, 1, 512], name="bias")
    g.gelu(g.add(g.matmul(x, w), bias)).set_output(True).set_name("y")
    return g


GPU_SHAPES = [{"batch": b, "seq": s} for b, s in ((1, 1), (3, 131), (8, 512), (2, 257), (5, 509))]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("pointer", [False, True], ids=["heuristic", "pointer"])
@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.HALF, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_matmul_bias_gelu_over_a_bucket(dt, pointer, monkeypatch):
    """The heuristic's configs (on Hopper host-descriptor and split-K ones: one sized kernel; device-side
    TMA ones generated at each shape) and the pointer configs (one sized kernel, compiled once) over one
    bucket, at 1, primes and the range's ends: each tile the shapes run (the bucket's own, or a tile variant
    at its small shapes) one module."""
    if pointer:
        _forced(monkeypatch, TMA=None, TMA_HOST=None, PERSISTENT=None, FLATTEN=None, SPLIT_K=None)
    no_tf32 = ["DOWN_CONVERT_INPUTS"] if dt == DT.FLOAT else []  # fp32 as the reference: no TF32
    plan = gpu_mlp(dt).build(device="cuda", engines=["triton"], buckets="one", deselect_numeric_notes=no_tf32)
    rng = np.random.default_rng(6)
    modules: dict[tuple, set[int]] = {}
    for env in GPU_SHAPES:
        run_at(plan, env, rng)
        (step,) = matmul_steps(plan.at(env))
        c = step.config
        if step.kernel.generated.sized:
            modules.setdefault(c.knobs, set()).add(id(step.kernel.module))
        else:
            assert c.knob("TMA") and not c.knob("TMA_HOST") and not pointer, c
    assert all(len(ids) == 1 for ids in modules.values()), modules
    assert modules or not pointer


# the Hopper path (templates/_matmul_hopper.py: host descriptors, persistent, flattened, the epilogue on
# column halves), forced on the CPU with small tiles: the interpreter takes TensorDescriptor arguments
HOPPER = {"TMA": 1, "TMA_HOST": 1, "PERSISTENT": 3, "FLATTEN": 1, "EPILOGUE_SUBTILE": 2}
HOPPER |= {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 1}


def _elements(dims, strides) -> set[int]:
    """The element offsets a tensor of these dims and strides covers (small shapes)."""
    offsets = np.zeros((), dtype=np.int64)
    for d, st in zip(dims, strides):
        offsets = np.add.outer(offsets, np.arange(d, dtype=np.int64) * st)
    return set(offsets.ravel().tolist())


@requires_interpreter
@pytest.mark.parametrize("dt", [DT.FLOAT, DT.BFLOAT16], ids=lambda d: d.name)
@pytest.mark.parametrize("make,shapes", CASES)
def test_host_descriptors_take_every_shape_of_the_bucket(make, shapes, dt, monkeypatch):
    """A host-descriptor config (the Hopper path, which the heuristic ranks first on an H100 / H200) in a
    bucket kernel: the descriptors' shapes and strides are expressions of the dynamic dims, encoded at
    each shape's bind, one source for every shape; a 2-D output is written through a descriptor of its
    own (linear). Each shape against the reference engine."""
    real = MatmulMatch.candidates
    monkeypatch.setattr(MatmulMatch, "candidates", lambda self: [real(self)[0].replace(**HOPPER)])
    plan = make(dt).build(device="cpu", engines=["triton"], buckets="one")
    check_one_sized_kernel(plan, shapes, np.random.default_rng(7), "matmul", run=run_at)
    for env in shapes:
        shaped = plan.at(env)
        (step,) = matmul_steps(shaped)
        assert step.config.knob("TMA_HOST") == 1 and "desc_A.load" in step.kernel.generated.source
        (launch,) = step.kernel.generated.launches
        descs = {a.uid: a for a in launch.args if a.kind == "desc"}
        assert len(descs) >= 2
        for uid, arg in descs.items():  # each encoded over the buffer's elements at this shape
            t = shaped.graph.tensors[uid]  # (its axes, or them with the batch folded into the rows)
            assert _elements(t.dim, t.stride) == _elements(arg.shape, arg.strides), (uid, arg, t)
            assert isinstance(arg.offset, int), (uid, arg)
    if make is linear:
        assert "desc_c" in step.kernel.generated.source  # (the output's TMA stores)


def swiglu(dt: og.DataType) -> og.Graph:
    """SiLU(x @ Wg) * (x @ Wu) over a dynamic batch and sequence, the weights [N, K] (nn.Linear's): a Llama
    block's two products of one A, computed side by side in one kernel (GemmPiece.siblings)."""
    g = _graph(dt, "swiglu")
    x = g.tensor(dim=[B, S, 32], name="x")
    wg, wu = (g.tensor(dim=[1, 32, 40], stride=[32 * 40, 1, 32], name=n) for n in ("w_gate", "w_up"))
    g.mul(g.swish(g.matmul(x, wg)), g.matmul(x, wu)).set_output(True).set_name("y")
    return g


def key_value(dt: og.DataType) -> og.Graph:
    """x @ Wk and x @ Wv, both stored (a block's key and value projections) over a dynamic batch and sequence."""
    g = _graph(dt, "key_value")
    x = g.tensor(dim=[B, S, 32], name="x")
    for name in ("k", "v"):
        g.matmul(x, g.tensor(dim=[1, 32, 24], name=f"w{name}")).set_output(True).set_name(name)
    return g


@requires_interpreter
@pytest.mark.parametrize("hopper", [False, True], ids=["pointer", "host_descriptors"])
@pytest.mark.parametrize("make", [swiglu, key_value])
def test_products_side_by_side_take_every_shape_of_the_bucket(make, hopper, monkeypatch):
    """Siblings (one piece of two products of one A) in a bucket kernel: one source taking the sizes at run
    time, on the pointer path and with host descriptors for A and both B operands; each shape against the
    reference engine."""
    if hopper:
        real = MatmulMatch.candidates
        monkeypatch.setattr(MatmulMatch, "candidates", lambda self: [real(self)[0].replace(**HOPPER)])
    plan = make(DT.BFLOAT16).build(device="cpu", engines=["triton"], buckets="one", allow_partition=False)
    check_one_sized_kernel(plan, BATCH_SEQ, np.random.default_rng(10), "matmul", run=run_at)
    (step,) = matmul_steps(plan.at(BATCH_SEQ[0]))
    assert len([n for n in step.piece.nodes if n.kind == "matmul"]) == 2
    assert ("desc_B_s0.load" in step.kernel.generated.source) == hopper


@requires_interpreter
def test_host_descriptors_of_a_view_at_a_dynamic_offset_and_of_a_by_reference_output(monkeypatch):
    """A descriptor over a view whose offset a dynamic dim sets (the second batch entry of x [2, seq, 32]:
    32 x seq elements in) takes that offset per shape; a by-reference output (read through the address
    table: its descriptor would be made in the kernel, its shape spelled out) is stored through pointers."""
    real = MatmulMatch.candidates
    monkeypatch.setattr(MatmulMatch, "candidates", lambda self: [real(self)[0].replace(**HOPPER)])
    seq = og.Dim("seq", 2, 37)
    g = _graph(DT.FLOAT, "second_entry")
    x, w = g.tensor(dim=[2, seq, 32], name="x"), g.tensor(dim=[1, 32, 40], name="w")
    y = g.matmul(g.slice(x, [slice(1, 2)]), w).set_output(True).set_name("y")
    y.set_is_by_reference(True)
    plan = g.build(device="cpu", engines=["triton"], buckets="one")
    shapes = [{"seq": n} for n in (2, 5, 37, 19)]
    check_one_sized_kernel(plan, shapes, np.random.default_rng(9), "matmul", run=run_at)
    for env in shapes:
        (step,) = matmul_steps(plan.at(env))
        (launch,) = step.kernel.generated.launches
        offsets = {a.offset for a in launch.args if a.kind == "desc" and a.uid == x.known_uid()}
        assert offsets == {32 * env["seq"]}
        assert "make_tensor_descriptor" not in step.kernel.generated.source  # (y: pointer stores)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
def test_gpu_projection_residual_and_mean_of_squares_over_a_bucket(dt):
    """A Llama block's output projection (d 1024) with the residual and the next RMSNorm's mean of squares,
    the heuristic's configs (on Hopper host descriptors): the row reduction spans column tiles (partials
    and a combine launch, laid out for the bucket's largest M); one module for every shape, each right."""
    batch, seq = og.Dim("batch", 1, 8), og.Dim("seq", 1, 512)
    g = _graph(dt, "gpu_oproj_rms")
    x, w = g.tensor(dim=[batch, seq, 1024], name="x"), g.tensor(dim=[1, 1024, 1024], name="w")
    h = g.add(g.matmul(x, w), g.tensor(dim=[batch, seq, 1024], name="residual"))
    h.set_output(True).set_name("h")
    ms = g.reduction(g.mul(h, h), mode="AVG").set_output(True).set_dim([batch, seq, 1]).set_name("ms")
    ms.set_data_type(DT.FLOAT)
    no_tf32 = ["DOWN_CONVERT_INPUTS"] if dt == DT.FLOAT else []
    plan = g.build(device="cuda", engines=["triton"], buckets="one", deselect_numeric_notes=no_tf32)
    check_one_sized_kernel(plan, GPU_SHAPES, np.random.default_rng(14), "matmul", run=run_at)
    for env in GPU_SHAPES:  # (a tile variant at the small shapes may split K: a launch summing the slices)
        gen = matmul_steps(plan.at(env))[0].kernel.generated
        kernels = [l.kernel for l in gen.launches]
        assert kernels in (["kernel", "kernel_combine0"], ["kernel", "kernel_epilogue", "kernel_combine0"]), kernels
        assert gen.bucket_scratch


def test_a_buckets_tiles_are_weighed_across_the_bucket():
    """One kernel serves every shape of a bucket, so its tiles are ranked by their estimates summed over
    shapes across it (mostly its large shapes' time), not at the hint alone: a Llama projection over
    batch 2-16 x seq 257-2048 (hint 6 x 720 = 4,320 rows, where 128 x 256 tiles make 1.03 waves) takes
    the 128 x 256 tiles the same product takes from 9,000 rows up; the static piece at the hint keeps
    128 x 128."""
    from opgraph.build.buckets import choose
    from opgraph.core.device import Device
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.matmul import BUCKET_SAMPLES, TEMPLATE

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    batch, seq = og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)
    g = _graph(DT.BFLOAT16, "o_proj")
    x, w = g.tensor(dim=[batch, seq, 1024], name="x"), g.tensor(dim=[1, 1024, 1024], stride=[1 << 20, 1, 1024])
    g.matmul(x, w).set_output(True)
    final = g.final
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    match = TEMPLATE.matched(make_piece(hint, 0, hint.nodes), h200)
    samples = match.bucket_samples
    assert len(samples) == BUCKET_SAMPLES
    assert samples[0][:3] == (2 * 257, 1024, 1) and samples[-1][:3] == (16 * 2048, 1024, 1)
    weight = 1024 * 1024 * 2  # (bytes: the weight's stay, the activations' grow with the rows)
    assert [s.moved_bytes - weight for s in (samples[0], samples[-1])] == [2 * 257 * 2048 * 2, 16 * 2048 * 2048 * 2]
    first = match.candidates()[0]
    assert (first.BLOCK_M, first.BLOCK_N) == (128, 256) and match.template.sized_knobs(first)
    static = og.Graph("o_proj_static", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    xs = static.tensor(dim=[6, 720, 1024], name="x")
    static.matmul(xs, static.tensor(dim=[1, 1024, 1024], stride=[1 << 20, 1, 1024])).set_output(True)
    piece = make_piece(static.final, 0, static.final.nodes)
    alone = TEMPLATE.matched(piece, h200)
    assert alone.bucket_samples == () and (alone.candidates()[0].BLOCK_M, alone.candidates()[0].BLOCK_N) == (128, 128)


def _two_layer_projections(batch: og.Dim, seq: og.Dim) -> og.FinalGraph:
    """Two pieces of one structure, as a model's layers repeat it: each a projection of x with the residual
    and a column sum over the dynamic rows (whose split-K kernels are made at each shape)."""
    g = _graph(DT.BFLOAT16, "layers")
    x = g.tensor(dim=[batch, seq, 1024], name="x")
    for i in range(2):
        w = g.tensor(dim=[1, 1024, 1024], stride=[1 << 20, 1, 1024], name=f"w{i}")
        h = g.add(g.matmul(x, w), x)
        h.set_output(True)
        g.reduction(h, mode="ADD").set_output(True).set_dim([1, 1, 1024])
    return g.final


def _matmul_matches(final: og.FinalGraph, device):  # type: ignore[no-untyped-def]
    from opgraph.build.buckets import choose
    from opgraph.core.piece import make_piece
    from opgraph.engines.triton.templates.matmul import TEMPLATE

    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    at = [i for i, n in enumerate(hint.nodes) if n.kind == "matmul"]
    matches = [TEMPLATE.matched(make_piece(hint, k, hint.nodes[i : i + 3]), device) for k, i in enumerate(at)]
    assert all(isinstance(m, MatmulMatch) and m.bucket is not None for m in matches)
    return matches


def test_identical_layers_share_the_split_kernel_decision(monkeypatch):
    """Whether a split-K config's kernels serve the whole bucket is decided by generating them (most of a
    bucket's planning); a model's layers ask the same of the same structure: the second layer's piece gets
    the first one's answer without generating anything, a bucket of other ranges generates again."""
    from opgraph.core.device import Device
    from opgraph.engines.triton.templates import matmul as matmul_template

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    first, second = _matmul_matches(_two_layer_projections(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)), h200)
    other = _matmul_matches(_two_layer_projections(og.Dim("batch", 1, 4), og.Dim("seq", 17, 256)), h200)[0]
    assert first._bucket_structure == second._bucket_structure  # (no UIDs or names in it)
    assert other._bucket_structure != first._bucket_structure
    plain = dict(TMA=None, TMA_HOST=None, PERSISTENT=None, FLATTEN=None, EPILOGUE_SUBTILE=None)
    split = first.candidates()[0].replace(BLOCK_M=64, BLOCK_N=32, SPLIT_K=4, **plain)
    asked: list[MatmulMatch] = []
    real = MatmulMatch._bucket_kernels

    def counting(self, k):  # type: ignore[no-untyped-def]
        if any(self is m for m in (first, second, other)):  # (not the bucket's own match, made inside)
            asked.append(self)
        return real(self, k)

    monkeypatch.setattr(MatmulMatch, "_bucket_kernels", counting)
    monkeypatch.setattr(matmul_template, "_ONE_KERNEL", {})  # (answers of earlier tests forgotten)
    assert first.one_kernel(split) is False  # (the column sum over the dynamic rows: made at each shape)
    assert second.one_kernel(split) is False
    assert other.one_kernel(split) is False
    assert [id(m) for m in asked] == [id(first), id(other)]


def test_a_buckets_ranking_asks_for_per_shape_kernels_only_down_to_its_count():
    """A bucket's candidates put the configs of per-shape kernels after the others (`_per_shape`, which
    generates a split config's kernels to find out): `_ranked` gives the first `count` of that order while
    asking it only of the configs ranked before the count-th kernel for the bucket."""
    from opgraph.core.device import Device

    h200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
    (match, _) = _matmul_matches(_two_layer_projections(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)), h200)
    plain = dict(TMA=None, TMA_HOST=None, PERSISTENT=None, FLATTEN=None, EPILOGUE_SUBTILE=None)
    base = match.candidates()[0].replace(**plain)
    configs = [
        base.replace(BLOCK_M=bm, BLOCK_N=bn, SPLIT_K=s)
        for bm, bn in ((64, 32), (128, 64), (128, 128))
        for s in (1, 2, 4)
    ]
    full = sorted(configs, key=lambda c: (match._per_shape(c), *match._rank(c)))
    for count in (1, 3, 5, len(configs)):
        assert match._ranked(configs, count) == full[:count]
    assert any(match._per_shape(c) for c in configs) and not all(match._per_shape(c) for c in configs)
