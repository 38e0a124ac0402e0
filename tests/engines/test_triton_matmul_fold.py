"""A matmul's broadcast batch axes folded into its rows (engines/triton/templates/_matmul_fold.py): which
pieces fold and to what tensors (CPU), that folded pieces compute what the reference engine does with
every candidate config under Triton's interpreter (small shapes), and, marked gpu, at ConvNeXt's MLP
shape on CUDA."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.device import Device
from opgraph.core.piece import make_piece
from opgraph.core.tensor import packed_strides
from opgraph.engines.triton.templates._matmul_fold import fold_rows

from ..helpers import assert_candidates_match, assert_engine_matches, candidate_configs, requires_cuda

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)


def linear(x_dims, n, *, x_strides=None, scale_dims=None, dt=DT.BFLOAT16, gelu=True):
    """x @ W^T + bias (then GELU, then * scale where `scale_dims` is given) over an activation of any
    rank, W [n, K] read transposed in place as the importer reads a Linear's weight."""
    g = og.Graph("fold", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    rank, k = len(x_dims), x_dims[-1]
    x = g.tensor(dim=list(x_dims), stride=list(x_strides or packed_strides(x_dims)), name="x")
    w = g.tensor(dim=[1] * (rank - 2) + [k, n], stride=[k * n] * (rank - 2) + [1, k], name="wt")
    b = g.tensor(dim=[1] * (rank - 1) + [n], name="b")
    y = g.add(g.matmul(x, w, name="mm"), b, name="bias")
    if gelu:
        y = g.gelu(y, name="gelu")
    if scale_dims is not None:
        y = g.mul(y, g.tensor(dim=list(scale_dims), name="scale"), name="scale")
    y.set_output(True)
    return g


def folded(g):
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    return piece, fold_rows(piece)


def test_channels_last_linear_folds_to_one_gemm():
    piece, f = folded(linear((4, 3, 5, 16), 24))
    assert f is not None
    mm = next(n for n in f.nodes if n.kind == "matmul")
    a, b, c = (f.tensor(u) for u in (mm.input("A"), mm.input("B"), mm.output_uids()[0]))
    assert (a.dim, a.stride) == ((60, 16), (16, 1))
    assert (b.dim, b.stride) == ((16, 24), (1, 16))
    assert c.dim == (60, 24)
    bias = next(n for n in f.nodes if n.name == "bias")
    assert f.tensor(bias.input_uids()[1]).dim == (1, 24)
    # the plan's graph is untouched
    assert piece.tensor(mm.input("A")).dim == (4, 3, 5, 16)


def test_every_batch_that_can_fold_folds():
    """Tokens that do not fill tiles (ViT's 197), and whole tiles too (a 2-D product has 2-D descriptors and
    TMA stores on Hopper); a 2-D product has nothing to fold."""
    assert folded(linear((8, 197, 32), 48))[1] is not None
    assert folded(linear((8, 256, 32), 48))[1] is not None
    assert folded(linear((197, 32), 48))[1] is None


@pytest.mark.interpreter
def test_products_side_by_side_fold_together(rng):
    """SwiGLU over [batch, tokens, d] activations with [1, K, N] weights: both products' B lose the batch
    axis, the rows merge."""
    g = og.Graph("swiglu3d", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 24, 32], name="x")
    wg, wu = (g.tensor(dim=[1, 32, 40], stride=[1280, 1, 32], name=n) for n in ("wg", "wu"))
    g.mul(g.swish(g.matmul(x, wg)), g.matmul(x, wu)).set_output(True)
    plan = g.build(device="cpu", engines=["triton", "reference"], allow_partition=False)
    from opgraph.engines.triton import TEMPLATES

    gp = next(t for t in TEMPLATES if t.name == "matmul").analyze(plan.steps[0].piece)[0]
    assert gp is not None and len(gp.siblings) == 1 and gp.space.dims == (48, 40)
    bad = og.testing.check_plan(plan, rng)
    assert not bad, "\n".join(map(str, bad))


@pytest.mark.parametrize(
    "why,kw",
    [
        ("a per-sample scale broadcasts over some folded axes only", {"scale_dims": (4, 1, 1, 24)}),
        # H and W swapped in memory: the rows do not nest
        ("rows that do not nest", {"x_strides": (240, 16, 48, 1)}),
    ],
)
def test_pieces_that_cannot_fold(why, kw):
    assert folded(linear((4, 3, 5, 16), 24, **kw))[1] is None, why


@pytest.mark.interpreter
@pytest.mark.parametrize("m", [1, 3])
def test_genstats_after_a_matmul_does_not_fold(m, rng):
    """genstats sums per channel (axis 1): over merged rows axis 1 would be the matmul's columns."""
    g = og.Graph("gs", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT)
    y = g.matmul(g.tensor(dim=[2, m, 16], name="x"), g.tensor(dim=[1, 16, 24], name="w"), name="mm")
    y.set_output(True)
    for t in g.genstats(y, name="gs"):
        t.set_output(True)
    assert folded(g)[1] is None
    assert_engine_matches(g, rng, rtol=1e-4, atol=1e-4)


def test_a_weight_per_batch_entry_keeps_its_batch_axis():
    g = og.Graph("bmm", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[4, 3, 5, 16], name="a")
    b = g.tensor(dim=[4, 1, 16, 8], name="b")
    g.matmul(a, b, name="mm").set_output(True)
    final = g.final
    piece = make_piece(final, 0, list(final.nodes))
    f = fold_rows(piece)
    assert f is not None  # the H axis folds, N (B's own batch axis) stays a batch axis
    mm = next(n for n in f.nodes if n.kind == "matmul")
    assert f.tensor(mm.input("A")).dim == (4, 15, 16) and f.tensor(mm.input("B")).dim == (4, 16, 8)


def square(prologue: bool):
    """x @ w + w (w read again by the epilogue), or (x + w) @ w (and by A's prologue): w square, so that
    both read it with the same dims."""
    g = og.Graph("again", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[2, 3, 16, 16], name="x")
    w = g.tensor(dim=[1, 1, 16, 16], name="w")
    y = g.matmul(g.add(x, w, name="pre"), w, name="mm") if prologue else g.add(g.matmul(x, w, name="mm"), w)
    y.set_output(True)
    return g


@pytest.mark.parametrize("prologue", [False, True], ids=["epilogue", "prologue"])
def test_b_read_again_does_not_fold(prologue):
    assert folded(square(prologue))[1] is None


@pytest.mark.interpreter
@pytest.mark.parametrize("prologue", [False, True], ids=["epilogue", "prologue"])
def test_b_read_again_computes_the_reference(prologue, rng):
    assert_engine_matches(square(prologue), rng, expect_steps=1, rtol=3e-2, atol=3e-2)


def test_a_dynamic_plans_piece_folds_as_its_symbolic_origin():
    """A bucket's piece folds where its symbolic origin does (the bucket's kernel is decided over it: one
    GEMM of n x 15 rows, a run-time size), the two alike; at a static shape the piece's own rule."""
    from opgraph.build.buckets import choose
    from opgraph.engines.triton.sizes import symbolic_piece

    final = linear((og.Dim("n", 1, 8), 3, 5, 16), 24).final
    bucket = choose(final).buckets[-1]
    inside = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(inside, 0, list(inside.nodes))
    folded, symbolic = fold_rows(piece), fold_rows(symbolic_piece(piece))
    assert folded is not None and symbolic is not None
    mm = next(n for n in piece.nodes if n.kind == "matmul")
    a, sym_a = folded.tensor(mm.input("A")), symbolic.tensor(mm.input("A"))
    assert len(a.dim) == len(sym_a.dim) == 2 and a.dim[0] == bucket.hint_map["n"] * 15
    assert str(sym_a.dim[0]) in ("15*n", "n*15")
    # a bucket whose rows are whole tiles folds too (its M is the bucket's, not the hint's)
    seq = og.Dim("seq", 64, 128)
    dyn = linear((2, seq, 16), 24).final
    b = choose(dyn).buckets[-1]
    at = dyn.in_bucket(b.hint_map, b)
    assert fold_rows(make_piece(at, 0, list(at.nodes))) is not None


def test_static_and_dynamic_buckets_compute_the_reference(rng):
    """Under the interpreter, a folded bucket kernel at several shapes of its bucket."""
    final_graph = linear((og.Dim("n", 1, 6), 3, 5, 16), 24, dt=DT.HALF)
    plan = final_graph.build(device="cpu", engines=["triton"], buckets="one")
    for n in (1, 4, 6):
        bad = og.testing.check_plan(plan.at({"n": n}), rng, rtol=3e-2, atol=3e-2)
        assert not bad, (n, bad)


def test_the_template_matches_the_folded_piece():
    from opgraph.engines.triton.templates.matmul import MatmulTemplate

    piece, _ = folded(linear((64, 14, 14, 384), 1536))
    m = MatmulTemplate().match(piece, H200)
    assert m.gp.space.m == 64 * 14 * 14 and m.gp.space.nbatch == 1
    assert m.candidates()[0].tma_host  # the Hopper path, which the unfolded piece's 3 batch axes had not


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "x_dims,kw",
    [
        ((2, 3, 5, 16), {}),
        ((2, 3, 5, 16), {"scale_dims": (1, 1, 1, 24)}),
        ((2, 3, 5, 16), {"scale_dims": (2, 3, 5, 24)}),  # a residual-like operand, folded with the rows
        ((2, 3, 5, 16), {"scale_dims": (2, 1, 1, 24)}),  # not folded
        ((2, 3, 5, 16), {"x_strides": (240, 16, 48, 1)}),  # not folded
        ((3, 7, 16), {"dt": DT.HALF}),
    ],
)
def test_folded_and_unfolded_pieces_compute_the_reference(x_dims, kw, rng):
    g = linear(x_dims, 24, **kw)
    assert_engine_matches(g, rng, expect_steps=1, rtol=3e-2, atol=3e-2)
    plan, step, configs = candidate_configs(g)
    assert_candidates_match(plan, step, configs, rng, rtol=3e-2, atol=3e-2)


def traced_linear(x_dims, n, dt=DT.BFLOAT16):
    """x @ W^T + bias as the torch.compile backend imports it: W [n, K] and the bias [n] graph inputs,
    W transposed, then both given the activation's rank by reshapes adding leading unit axes."""
    g = og.Graph("traced", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    rank, k = len(x_dims), x_dims[-1]
    x = g.tensor(dim=list(x_dims), name="x")
    w = g.tensor(dim=[n, k], name="w")
    b = g.tensor(dim=[n], name="b")
    wt = g.reshape(g.transpose(w, [1, 0], name="wt"), [1] * (rank - 2) + [k, n], name="batch")
    y = g.add(g.matmul(x, wt, name="mm"), g.reshape(b, [1] * (rank - 1) + [n], name="bias_rank"), name="bias")
    g.gelu(y, name="gelu").set_output(True)
    return g


def test_a_traced_linear_folds_through_the_weights_and_the_bias_reshapes():
    piece, f = folded(traced_linear((4, 3, 5, 16), 24))
    assert f is not None
    mm = next(n for n in f.nodes if n.kind == "matmul")
    a, b, c = (f.tensor(u) for u in (mm.input("A"), mm.input("B"), mm.output_uids()[0]))
    assert a.dim == (60, 16) and b.dim == (16, 24) and c.dim == (60, 24)
    reshapes = {n.name: n.op.dim for n in f.nodes if n.kind == "reshape"}
    assert reshapes == {"batch": (16, 24), "bias_rank": (1, 24)}
    assert piece.tensor(mm.input("B")).dim == (1, 1, 16, 24)  # (the plan's graph is untouched)


@pytest.mark.interpreter
@pytest.mark.parametrize("x_dims", [(2, 3, 5, 16), (3, 7, 16)])
def test_traced_linears_compute_the_reference(x_dims, rng):
    g = traced_linear(x_dims, 24)
    assert_engine_matches(g, rng, expect_steps=1, rtol=3e-2, atol=3e-2)
    plan, step, configs = candidate_configs(g)
    assert_candidates_match(plan, step, configs, rng, rtol=3e-2, atol=3e-2)


def data_gradient(x_dims=(2, 7, 16), n=24, *, perm=None, sum_dims=None, w_again=False, dt=DT.BFLOAT16):
    """A training step's fc1 data gradient: dY @ W (W [1, n, K] in memory, transposed in place), the erf
    GELU's backward at the saved input, and the bias gradient (the sum over batch and tokens)."""
    g = og.Graph("dgrad", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    rank, k = len(x_dims), x_dims[-1]
    perm = perm or (*range(rank - 2), rank - 1, rank - 2)
    dy = g.tensor(dim=list(x_dims), name="dy")
    b_dims = [1] * (rank - 2) + [k, n]
    w = g.tensor(dim=[b_dims[p] for p in perm], name="w")  # (perm is its own inverse)
    pre = g.tensor(dim=[*x_dims[:-1], n], name="pre")
    dh = g.matmul(dy, g.transpose(w, list(perm), name="wt"), name="mm")
    if w_again:  # W's memory read again by the epilogue, through its own transpose
        dh = g.add(dh, g.reduction(g.transpose(w, list(perm)), "ADD").set_dim([1] * (rank - 1) + [n]))
    dpre = g.gelu_backward(dh, pre, name="dgelu")
    dpre.set_output(True).set_data_type(dt)
    g.reduction(dpre, "ADD", name="db").set_dim(list(sum_dims or [1] * (rank - 1) + [n])).set_output(True)
    return g


def test_a_data_gradient_folds_through_the_weights_transpose_and_the_bias_sum():
    """The transpose that makes B loses the dropped axes (its permutation on the rest), and the bias
    gradient becomes a sum over the folded rows."""
    _, f = folded(data_gradient())
    assert f is not None
    mm = next(n for n in f.nodes if n.kind == "matmul")
    assert f.tensor(mm.input("A")).dim == (14, 16) and f.tensor(mm.input("B")).dim == (16, 24)
    wt = next(n for n in f.nodes if n.name == "wt")
    assert wt.op.permutation == (1, 0) and f.tensor(wt.input_uids()[0]).dim == (24, 16)
    db = next(n for n in f.nodes if n.name == "db")
    assert f.tensor(db.output_uids()[0]).dim == (1, 24)


@pytest.mark.parametrize(
    "why,kw",
    [
        ("a sum that keeps the batch axis", {"sum_dims": (2, 1, 24)}),
        ("a transpose that moves a dropped axis", {"x_dims": (2, 3, 7, 16), "perm": (1, 0, 3, 2)}),
        ("W read again outside B's views", {"w_again": True}),
    ],
)
def test_data_gradients_that_cannot_fold(why, kw):
    assert folded(data_gradient(**kw))[1] is None, why


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "kw",
    [{}, {"x_dims": (2, 3, 5, 16)}, {"sum_dims": (2, 1, 24)}, {"dt": DT.HALF}],
    ids=["tokens", "two_batch_axes", "not_folded", "half"],
)
def test_data_gradients_compute_the_reference(kw, rng):
    g = data_gradient(**kw)
    assert_engine_matches(g, rng, expect_steps=1, rtol=3e-2, atol=3e-2)
    plan, step, configs = candidate_configs(g)
    assert_candidates_match(plan, step, configs, rng, rtol=3e-2, atol=3e-2)


def test_a_dynamic_data_gradient_computes_the_reference(rng):
    """Under the interpreter, a bucket's data gradient (batch dynamic) at several shapes of its bucket:
    the folded piece's views map back to the bucket's symbolic nodes."""
    plan = data_gradient((og.Dim("n", 1, 6), 7, 16), dt=DT.HALF).build(device="cpu", engines=["triton"], buckets="one")
    for n in (1, 4, 6):
        bad = og.testing.check_plan(plan.at({"n": n}), rng, rtol=3e-2, atol=3e-2)
        assert not bad, (n, bad)


@pytest.mark.gpu
@requires_cuda
def test_gpu_convnext_mlp_folded(rng):
    """ConvNeXt-T's stage-3 MLP up-projection (bias + GELU) over channels-last [64, 14, 14, 384] on CUDA,
    folded into one GEMM of 12,544 rows (the Hopper path)."""
    g = linear((64, 14, 14, 384), 1536)
    plan = assert_engine_matches(g, rng, device="cuda", expect_steps=1, rtol=5e-2, atol=5e-2)
    assert plan.steps[0].config.knob("TMA_HOST"), plan.describe()


@pytest.mark.gpu
@requires_cuda
def test_gpu_vit_fc1_data_gradient_folded(rng):
    """ViT-B/16's fc1 data gradient with the GELU backward and the bias gradient, over 8 x 197 tokens on
    CUDA: folded into one GEMM of 1,576 rows through the weight's transpose (the Hopper path). The GELU
    gradient against the reference engine; the bias gradient against the float64 sums of the plan's own
    bf16 GELU gradient (the reference's differ by the sum of 1,576 roundings)."""
    import numpy as np

    from opgraph.core.torch_interop import pack_to_device, torch_to_numpy
    from opgraph.testing import compare, random_pack, reference_outputs

    plan = data_gradient((8, 197, 768), 3072).build(device="cuda", engines=["triton"])
    (step,) = plan.steps
    assert fold_rows(step.piece) is not None and step.config.knob("TMA_HOST"), plan.describe()
    graph = plan.graph
    pack = random_pack(graph, rng)
    want = reference_outputs(graph, pack)
    dev = pack_to_device(pack, "cuda")
    plan.execute(dev)
    dpre, db = (next(u for u in graph.outputs if graph.tensors[u].name.startswith(n)) for n in ("dgelu", "db"))
    got = torch_to_numpy(dev[dpre])
    assert compare(graph.tensors[dpre], got, want[dpre], rtol=5e-2, atol=5e-2) is None
    sums = got.astype(np.float64).sum(axis=(0, 1), keepdims=True)
    np.testing.assert_allclose(torch_to_numpy(dev[db]), sums, rtol=1e-4, atol=1e-3)


def heads_projection(b=2, heads=4, s=6, d=8, n=24, *, layout="bshd", stats=True, dt=DT.BFLOAT16):
    """The output projection of an attention layer: the attention output's heads transposed back to tokens and
    merged (transpose + reshape, read in place), times W^T, plus the residual, and the next RMSNorm's mean of
    squares. `layout`: the attention output's memory ("bshd": tokens then heads, as cuDNN's SDPA writes it, where
    the merged rows nest; "bshd_padded": each batch entry's rows twice as far apart, where the heads merge in
    place but the rows do not; "bhsd": heads then tokens, where neither does)."""
    g = og.Graph("heads", io_data_type=dt, intermediate_data_type=DT.FLOAT)
    dims = [b, heads, s, d]
    strides = {
        "bshd": [s * heads * d, d, heads * d, 1],
        "bshd_padded": [2 * s * heads * d, d, heads * d, 1],
        "bhsd": list(packed_strides(dims)),
    }[layout]
    o = g.tensor(dim=dims, stride=strides, name="o")
    w = g.tensor(dim=[1, heads * d, n], stride=[heads * d * n, 1, heads * d], name="wt")
    r = g.tensor(dim=[b, s, n], name="residual")
    a = g.reshape(g.transpose(o, [0, 2, 1, 3], name="tokens"), [b, s, heads * d], name="merge")
    h = g.add(g.matmul(a, w, name="proj"), r, name="res").set_output(True).set_data_type(dt)
    if stats:
        g.reduction(g.mul(h, h), "AVG", name="ms").set_dim([b, s, 1]).set_output(True)
    return g


def test_the_merged_heads_fold_into_rows():
    """A is a reshape of the transposed attention output: the reshape merges the rows too (the views before it
    read as they are), so the product is 2-D and the Hopper path's descriptors take it."""
    from opgraph.engines.triton.templates.matmul import MatmulTemplate

    piece, f = folded(heads_projection())
    assert f is not None
    mm = next(n for n in f.nodes if n.kind == "matmul")
    merge = next(n for n in f.nodes if n.name == "merge")
    assert f.tensor(mm.input("A")).dim == (12, 32) and tuple(merge.op.dim) == (12, 32)
    assert f.tensor(merge.input_uids()[0]).dim == (2, 6, 4, 8)  # (the transposed heads keep their rank)
    m = MatmulTemplate().match(piece, H200)
    assert m.gp.space.nbatch == 1 and m.gp.space.m == 12


def test_merged_heads_whose_rows_do_not_nest_keep_their_batch_axis():
    """The folded reshape would not be a view in place (each batch entry's rows apart): the template analyses the
    piece as it is, a batch axis of 2."""
    from opgraph.engines.triton.templates.matmul import MatmulTemplate

    piece, f = folded(heads_projection(layout="bshd_padded"))
    assert f is not None  # (the declared tensors fold; their memory does not)
    m = MatmulTemplate().match(piece, H200)
    assert m.gp.space.nbatch == 2 and m.gp.space.m == 6


@pytest.mark.interpreter
@pytest.mark.parametrize("layout", ["bshd", "bshd_padded"])
@pytest.mark.parametrize("stats", [False, True])
def test_merged_heads_compute_the_reference(layout, stats, rng):
    g = heads_projection(layout=layout, stats=stats)
    assert_engine_matches(g, rng, expect_steps=1, rtol=3e-2, atol=3e-2)
    plan, step, configs = candidate_configs(g)
    assert_candidates_match(plan, step, configs, rng, rtol=3e-2, atol=3e-2)


def test_merged_heads_of_a_dynamic_plan_do_not_fold():
    """A bucket piece folds as its symbolic piece does; whether the folded reshape is a view in place is not decided
    over symbolic sizes, so the merged heads fold at static shapes only: the bucket's piece and its symbolic piece
    agree (both keep the batch axis)."""
    from opgraph.build.buckets import choose
    from opgraph.engines.triton.sizes import symbolic_piece

    g = og.Graph("heads_dyn", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    b, s, heads, d, n = og.Dim("n", 1, 6), 6, 4, 8, 24
    o = g.tensor(dim=[b, heads, s, d], stride=[s * heads * d, d, heads * d, 1], name="o")
    w = g.tensor(dim=[1, heads * d, n], stride=[heads * d * n, 1, heads * d], name="wt")
    a = g.reshape(g.transpose(o, [0, 2, 1, 3], name="tokens"), None, name="merge").set_dim([b, s, heads * d])
    g.add(g.matmul(a, w, name="proj"), g.tensor(dim=[b, s, n], name="residual")).set_output(True)
    final = g.final
    bucket = choose(final).buckets[-1]
    inside = final.in_bucket(bucket.hint_map, bucket)
    piece = make_piece(inside, 0, list(inside.nodes))
    assert fold_rows(symbolic_piece(piece)) is None and fold_rows(piece) is None
