"""In-place updates through the variant pack (opgraph.aliasing): an output bound to the very buffer of
an input it depends on element by element is accepted; every other overlap is refused with
VariantPackError (rule pack.overlap), naming the reason, and nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.runtime.aliasing import dependents, plan_inplace
from opgraph.runtime.bindings import _views_overlap
from opgraph.memory.buffers import BufferInfo
from opgraph.testing import clone, compare, random_pack, reference_outputs

from ..helpers import requires_cuda

D = og.DataType


def _run_in_place(g: og.Graph, over: dict[str, str], rng, *, device="cpu", engines=None, prepare=None):
    """Run g with each output named in `over` bound to the buffer of the named input; compare with the
    reference computed on separate buffers. Returns the plan."""
    plan = g.build(device=device, engines=engines)
    f = plan.graph
    pack = random_pack(f, rng)
    if prepare is not None:
        prepare(f, pack)
    want = reference_outputs(f, pack)
    aliased = {u: (clone(v) if isinstance(v, np.ndarray) else v) for u, v in pack.items()}
    for out, inp in over.items():
        aliased[f.tensor(out).uid] = aliased[f.tensor(inp).uid]
    if device == "cpu":
        plan.execute(aliased)
        got = aliased
    else:
        from opgraph.core.torch_interop import pack_to_device, torch_to_numpy

        dev = pack_to_device({u: v for u, v in aliased.items() if f.tensors[u].name not in over}, "cuda")
        for out, inp in over.items():
            dev[f.tensor(out).uid] = dev[f.tensor(inp).uid]
        plan.execute(dev)
        got = {u: torch_to_numpy(v) if hasattr(v, "cpu") else v for u, v in dev.items()}
    for u in f.outputs:
        assert compare(f.tensors[u], got[u], want[u]) is None, (f.tensors[u].label(), plan.describe())
    return plan


def _pointwise_chain(dt=D.FLOAT):
    g = og.Graph("chain", io_data_type=dt)
    x = g.tensor(dim=[2, 3, 4, 5], name="x")
    s = g.tensor(dim=[1, 3, 1, 1], name="s")
    b = g.tensor(dim=[1, 3, 1, 1], name="b")
    g.relu(g.add(g.mul(x, s), b), lower_clip=-0.5).set_output(True).set_name("y")
    return g


def _batchnorm(dt=D.FLOAT):
    g = og.Graph("bn", io_data_type=dt)
    x = g.tensor(dim=[4, 6, 3, 3], stride=[54, 1, 18, 6], name="x")
    scale, bias = (
        g.tensor(dim=[1, 6, 1, 1], name="scale", data_type=D.FLOAT),
        g.tensor(dim=[1, 6, 1, 1], name="bias", data_type=D.FLOAT),
    )
    rm, rv = (g.tensor(dim=[1, 6, 1, 1], name=n, data_type=D.FLOAT) for n in ("rm", "rv"))
    y, mean, inv, nrm, nrv = g.batchnorm(x, scale, bias, rm, rv, epsilon=1e-5, momentum=0.1)
    for t, n in ((y, "y"), (mean, "mean"), (inv, "inv"), (nrm, "next_rm"), (nrv, "next_rv")):
        t.set_output(True).set_name(n)
    return g


def _positive_var(f, pack):
    rv = pack[f.tensor("rv").uid]
    rv[...] = np.abs(rv) + 0.5


def test_pointwise_chain_over_its_input(rng):
    plan = _run_in_place(_pointwise_chain(), {"y": "x"}, rng)
    assert len(plan.inplace.allowed) == 1


def test_batchnorm_running_stats_over_their_inputs(rng):
    _run_in_place(_batchnorm(), {"next_rm": "rm", "next_rv": "rv"}, rng, prepare=_positive_var)


def test_two_outputs_over_interleaved_views(rng):
    """Rotary-embedding style: y1 over q[..., :4] and y2 over q[..., 4:8], each from both halves."""
    g = og.Graph("rope", io_data_type=D.FLOAT)
    x1 = g.tensor(dim=[3, 5, 4], stride=[80, 16, 1], name="x1")
    x2 = g.tensor(dim=[3, 5, 4], stride=[80, 16, 1], name="x2")
    c, s = g.tensor(dim=[1, 5, 4], name="c"), g.tensor(dim=[1, 5, 4], name="s")
    g.sub(g.mul(x1, c), g.mul(x2, s)).set_output(True).set_name("y1").set_stride([80, 16, 1])
    g.add(g.mul(x2, c), g.mul(x1, s)).set_output(True).set_name("y2").set_stride([80, 16, 1])
    plan = g.build(device="cpu")
    f = plan.graph
    base = rng.standard_normal(3 * 80).astype(np.float32)
    q = base.reshape(3, 5, 16)
    cv, sv = rng.standard_normal((1, 5, 4)).astype(np.float32), rng.standard_normal((1, 5, 4)).astype(np.float32)
    a, b = q[..., :4].astype(np.float64), q[..., 4:8].astype(np.float64)
    want1, want2 = a * cv - b * sv, b * cv + a * sv
    rest = q[..., 8:].copy()
    plan.execute({"x1": q[..., :4], "x2": q[..., 4:8], "c": cv, "s": sv, "y1": q[..., :4], "y2": q[..., 4:8]})
    np.testing.assert_allclose(q[..., :4], want1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(q[..., 4:8], want2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(q[..., 8:], rest)  # the elements no output owns are untouched
    assert {(f.tensor("x1").uid, f.tensor("y1").uid), (f.tensor("x2").uid, f.tensor("y2").uid)} <= plan.inplace.allowed


def test_conv_epilogue_over_its_residual(rng):
    g = og.Graph("res", io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 4, 5, 5], name="x")
    w = g.tensor(dim=[4, 4, 3, 3], name="w")
    r = g.tensor(dim=[2, 4, 5, 5], name="r")
    g.relu(g.add(g.conv_fprop(x, w, padding=1), r)).set_output(True).set_name("y")
    _run_in_place(g, {"y": "r"}, rng)


# -- refused packs ---------------------------------------------------------------------------------------------
def _centered():
    g = og.Graph("centered", io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    m = g.reduction(x, mode=og.ReductionMode.AVG).set_dim([4, 1])
    g.sub(x, m).set_output(True).set_name("y")
    return g, {"y": "x"}, "depends on other elements"


def _transposed():
    g = og.Graph("transposed", io_data_type=D.FLOAT)
    x = g.tensor(dim=[5, 5], name="x")
    g.add(x, g.transpose(x, [1, 0])).set_output(True).set_name("y")
    return g, {"y": "x"}, "depends on other elements"


def _unrelated():
    g = og.Graph("unrelated", io_data_type=D.FLOAT)
    x, z = g.tensor(dim=[4, 6], name="x"), g.tensor(dim=[4, 6], name="z")
    g.exp(x).set_output(True).set_name("e")
    g.relu(z).set_output(True).set_name("y")
    return g, {"y": "x"}, "does not depend on"


def _reduced_in_the_same_kernel():
    g = og.Graph("same_kernel", io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    g.relu(x).set_output(True).set_name("y")
    g.reduction(x, mode=og.ReductionMode.ADD).set_dim([1, 6]).set_output(True).set_name("s")
    return g, {"y": "x"}, "depends on other elements of tensor 'x'"


REFUSED = {
    "centered": _centered,
    "transposed": _transposed,
    "unrelated": _unrelated,
    "reduced in the same kernel": _reduced_in_the_same_kernel,
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_in_place_writes_nothing(rng, name):
    g, over, why = REFUSED[name]()
    plan = g.build(device="cpu")
    f = plan.graph
    pack = random_pack(f, rng)
    for out, inp in over.items():
        pack[f.tensor(out).uid] = pack[f.tensor(inp).uid]
    snap = [(v, v.copy()) for v in pack.values() if isinstance(v, np.ndarray)]
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack)
    assert ei.value.rule == "pack.overlap" and "that very buffer" in str(ei.value) and why in str(ei.value), str(
        ei.value
    )
    for now, before in snap:
        np.testing.assert_array_equal(now, before)  # inputs unchanged, outputs still poisoned


@pytest.mark.parametrize("how", ["shifted by one element", "transposed view"])
def test_overlaps_that_are_not_the_same_buffer_are_refused(rng, how):
    if how == "shifted by one element":
        plan = _pointwise_chain().build(device="cpu")
        f = plan.graph
        pack = random_pack(f, rng)
        x = pack[f.tensor("x").uid]
        big = np.zeros(x.size + 1, np.float32)
        big[: x.size] = x.reshape(-1)
        pack[f.tensor("x").uid] = big[: x.size].reshape(x.shape)
        pack[f.tensor("y").uid] = big[1:].reshape(x.shape)
    else:  # the same address and dims, other strides: not the same buffer
        g = og.Graph(io_data_type=D.FLOAT)
        g.neg(g.tensor(dim=[4, 4], name="x")).set_output(True).set_name("y").set_stride([1, 4])
        plan = g.build(device="cpu")
        arr = rng.standard_normal((4, 4)).astype(np.float32)
        pack = {"x": arr, "y": arr.T}
    snap = [(v, v.copy()) for v in pack.values() if isinstance(v, np.ndarray)]
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack)
    assert ei.value.rule == "pack.overlap" and "that very buffer" not in str(ei.value), str(ei.value)
    for now, before in snap:
        np.testing.assert_array_equal(now, before)


def test_a_reader_after_the_writing_step_is_refused():
    """Synthetic steps: y = relu(x) written in step 0, e = exp(x) read in step 1."""
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    g.relu(x, name="r").set_output(True).set_name("y")
    g.exp(x, name="e").set_output(True).set_name("e")
    f = g.final
    r, e = (next(n for n in f.nodes if n.name == k) for k in ("r", "e"))
    x_uid, y_uid = f.tensor("x").uid, f.tensor("y").uid
    rule = plan_inplace(f, [[r], [e]], [True, True], ["a", "b"])
    assert (x_uid, y_uid) not in rule.allowed and "after step 0 wrote" in rule.reason(x_uid, y_uid)
    assert (x_uid, y_uid) in plan_inplace(f, [[e], [r]], [True, True], ["a", "b"]).allowed
    unsafe = plan_inplace(f, [[r, e]], [False], ["library"])
    assert "library" in unsafe.reason(x_uid, y_uid) and (x_uid, y_uid) not in unsafe.allowed


def test_dependents_follow_aligned_ops_only():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 6], name="x")
    b = g.tensor(dim=[1, 6], name="b")
    a1 = g.add(x, b).set_name("a1")  # aligned with x
    s = g.reduction(a1, mode=og.ReductionMode.ADD).set_dim([4, 1]).set_name("s")  # other
    g.mul(a1, s).set_output(True).set_name("y")  # depends on other elements through s
    g.exp(b).set_output(True).set_name("eb")
    f = g.final
    aligned, other = dependents(f, f.tensor("x").uid)
    names = {f.tensors[u].name for u in aligned}, {f.tensors[u].name for u in other}
    assert names == ({"x", "a1"}, {"s", "y"})
    aligned_b, _ = dependents(f, f.tensor("b").uid)
    assert f.tensor("y").uid not in aligned_b  # b [1, 6] broadcast to [4, 6]: not aligned


def _info(ptr, shape, strides):
    return BufferInfo(tuple(shape), tuple(strides), D.FLOAT, "cuda:0", ptr * 4, None)


@pytest.mark.parametrize(
    "shape, strides, diff, overlap",
    [
        ((3, 4), (16, 1), 4, False),  # q[..., :4] vs q[..., 4:8]
        ((3, 4), (16, 1), 2, True),
        ((2, 3), (10, 1), 8, True),  # 8 = 10 - 2: element [1, 0] of one is element [0, 2] of the other
        ((2, 3), (1, 10), 5, False),
        ((4,), (2,), 1, False),  # even and odd elements
        ((4,), (2,), 2, True),
    ],
)
def test_views_overlap_is_exact_for_nested_layouts(shape, strides, diff, overlap):
    assert _views_overlap(_info(100, shape, strides), _info(100 + diff, shape, strides)) is overlap


# -- generated kernels and the GPU ------------------------------------------------------------------------
@pytest.mark.interpreter
def test_generated_pointwise_kernel_in_place(rng):
    plan = _run_in_place(_pointwise_chain(), {"y": "x"}, rng, engines=["triton"])
    assert plan.steps[0].config.engine == "triton"


@pytest.mark.interpreter
def test_generated_batchnorm_running_stats_in_place(rng):
    plan = _run_in_place(
        _batchnorm(), {"next_rm": "rm", "next_rv": "rv"}, rng, engines=["triton"], prepare=_positive_var
    )
    assert {s.config.knob("template") for s in plan.steps} == {"norm_stats"}


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("build", [_pointwise_chain, _batchnorm], ids=["pointwise", "batchnorm"])
def test_gpu_in_place(rng, build):
    over = {"y": "x"} if build is _pointwise_chain else {"next_rm": "rm", "next_rv": "rv"}
    plan = _run_in_place(
        build(), over, rng, device="cuda", prepare=None if build is _pointwise_chain else _positive_var
    )
    assert plan.inplace.allowed


@pytest.mark.gpu
@requires_cuda
def test_gpu_fast_path_accepts_the_same_in_place_pack_again(rng):
    import torch

    g = _pointwise_chain()
    plan = g.build(device="cuda")
    f = plan.graph
    x = torch.randn(2, 3, 4, 5, device="cuda")
    s, b = torch.rand(1, 3, 1, 1, device="cuda"), torch.rand(1, 3, 1, 1, device="cuda")
    x0 = x.clone()
    pack = {"x": x, "s": s, "b": b, "y": x}
    plan.execute(pack)
    plan.execute(pack)  # the fast binder's path: twice the update
    once = torch.clamp_min(x0 * s + b, -0.5)
    torch.testing.assert_close(x, torch.clamp_min(once * s + b, -0.5))
    assert plan.local_state().binder._fast(pack) is not None  # the in-place pack takes the fast path
    assert plan.local_state().binder.inplace is plan.inplace
    del f
