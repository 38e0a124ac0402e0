"""Variant packs: every way to key and fill one, and every way to get one wrong.

A rejected pack must raise a VariantPackError naming the tensor and leave every buffer as it was:
outputs still poisoned, inputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.testing import compare, poison, random_values

D = og.DataType
SHAPE = (2, 3, 4, 5)


class Case:
    """One graph: t = x + b (virtual); y = t * s (s pass-by-value); w = exp(t) * k (k a 1-element tensor)."""

    def __init__(self) -> None:
        g = og.Graph(name="bind", io_data_type=D.FLOAT)
        self.x = g.tensor(dim=SHAPE, name="x", uid=1)
        self.b = g.tensor(dim=[1, 3, 1, 1], name="b", uid=2)
        self.s = g.tensor(dim=[1], name="s", uid=3, is_pass_by_value=True)
        self.k = g.tensor(dim=[1, 1, 1, 1], name="k", uid=4)
        self.t = g.add(self.x, self.b, name="add").set_uid(5).set_name("t")
        self.y = g.mul(self.t, self.s).set_output(True).set_name("y").set_uid(6)
        self.w = g.mul(g.exp(self.t), self.k).set_output(True).set_name("w").set_uid(7)
        self.g = g
        self.plan = g.build(device="cpu")
        self.final = g.final

    def pack(self, rng) -> dict:
        f = self.final
        return {
            self.x: random_values(f.tensors[1], rng),
            self.b: random_values(f.tensors[2], rng),
            self.s: 1.75,
            self.k: random_values(f.tensors[4], rng),
            self.y: poison(np.empty(SHAPE, np.float32)),
            self.w: poison(np.empty(SHAPE, np.float32)),
        }

    def want(self, x, b, s, k):
        t = np.asarray(x, np.float64) + np.asarray(b, np.float64)
        return t * float(s), np.exp(t) * float(np.asarray(k).reshape(()))

    def check(self, y, w, x, b, s, k):
        wy, ww = self.want(x, b, s, k)
        assert compare(self.final.tensors[6], y, wy) is None
        assert compare(self.final.tensors[7], w, ww) is None


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


def snapshot(pack: dict) -> list:
    return [(v, np.array(v, copy=True)) for v in pack.values() if isinstance(v, np.ndarray)]


def assert_untouched(snap: list) -> None:
    for arr, before in snap:
        np.testing.assert_array_equal(arr, before)  # NaN poison compares equal to NaN poison


# -- accepted packs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("keying", ["handle", "uid", "name", "desc", "numpy-int", "mixed"])
def test_keys(case, rng, keying):
    p = case.pack(rng)
    f = case.final

    def key(h):
        uid = h.uid
        return {
            "handle": h,
            "uid": uid,
            "name": h.name,
            "desc": f.tensors[uid],
            "numpy-int": np.int64(uid),
            "mixed": (h if uid % 2 else h.name),
        }[keying]

    pack = {key(h): v for h, v in p.items()}
    case.plan.execute(pack)
    case.check(p[case.y], p[case.w], p[case.x], p[case.b], p[case.s], p[case.k])


@pytest.mark.parametrize(
    "value",
    [2.0, 2, np.float32(2.0), np.float64(2.0), np.array(2.0), np.array([2.0]), np.array([[2.0]], np.float16), "torch"],
    ids=["float", "int", "np.float32", "np.float64", "0d", "1-element", "1x1-f16", "torch"],
)
def test_pass_by_value_forms(case, rng, value):
    if isinstance(value, str):
        torch = pytest.importorskip("torch")
        value = torch.tensor([2.0])
    p = case.pack(rng)
    p[case.s] = value
    case.plan.execute(p)
    case.check(p[case.y], p[case.w], p[case.x], p[case.b], 2.0, p[case.k])


@pytest.mark.parametrize("shape", [(1,), (), (1, 1, 1, 1, 1)])
def test_one_element_tensor_binds_in_any_rank(case, rng, shape):
    p = case.pack(rng)
    p[case.k] = np.full(shape, -0.5, np.float32)
    case.plan.execute(p)
    case.check(p[case.y], p[case.w], p[case.x], p[case.b], p[case.s], -0.5)


def test_torch_buffers(case, rng):
    torch = pytest.importorskip("torch")
    p = case.pack(rng)
    tp = {h: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for h, v in p.items()}
    case.plan.execute(tp)
    case.check(p[case.y], p[case.w], p[case.x], p[case.b], p[case.s], p[case.k])  # written through


def test_inputs_may_share_memory(rng):
    g = og.Graph(io_data_type=D.FLOAT)
    a = g.tensor(dim=[3, 4], name="a")
    b = g.tensor(dim=[3, 4], name="b")
    y = g.sub(a, b).set_output(True)
    arr = random_values(g.final.tensors[a.uid], rng)
    out = poison(np.empty((3, 4), np.float32))
    g.build(device="cpu").execute({a: arr, b: arr, y: out})
    assert (out == 0).all()


def test_handles_still_bind_after_the_graph_changed(case, rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4], name="x")  # UIDs assigned, not set
    y = g.neg(x).set_output(True)
    plan = g.build(device="cpu")
    g.abs(y).set_output(True)  # the graph changes; the plan keeps what it was built from
    xv = random_values(plan.graph.tensors[plan.graph.inputs[0]], rng)
    out = poison(np.empty(4, np.float32))
    plan.execute({x: xv, y: out})
    np.testing.assert_array_equal(out, -xv)


# -- rejected packs --------------------------------------------------------------------------------------


def _overlap_out_out(c, p):
    big = poison(np.empty(180, np.float32))
    p[c.y] = big[:120].reshape(SHAPE)
    p[c.w] = big[60:180].reshape(SHAPE)


def _overlap_in_out(c, p):
    big = np.zeros(180, np.float32)
    big[:120] = p[c.x].reshape(-1)
    p[c.x] = big[:120].reshape(SHAPE)
    p[c.y] = big[60:180].reshape(SHAPE)
    big[120:] = np.nan


def _readonly(c, p):
    p[c.y].flags.writeable = False


def _missing(c, p):
    del p[c.x]
    del p[c.y]


def _twice(c, p):
    p["x"] = p[c.x]


def _virtual(c, p):
    p[c.t] = poison(np.empty(SHAPE, np.float32))


def _device(c, p):
    torch = pytest.importorskip("torch")
    p[c.x] = torch.empty(SHAPE, device="meta")


def _set(key_fn, value_fn):
    def mutate(c, p):
        p[key_fn(c)] = value_fn(c, p)

    return mutate


REJECTED = {
    "unknown uid": (_set(lambda c: 999, lambda c, p: p[c.x]), "pack.unknown", "999"),
    "unknown name": (_set(lambda c: "nope", lambda c, p: p[c.x]), "pack.unknown", "'nope'"),
    "bad key type": (_set(lambda c: 1.0, lambda c, p: p[c.x]), "pack.key", "float"),
    "virtual": (_virtual, "pack.virtual", "'t' (uid 5)"),
    "bound twice": (_twice, "pack.duplicate", "'x' (uid 1)"),
    "missing": (_missing, "pack.missing", "'x' (uid 1), 'y' (uid 6)"),
    "shape": (_set(lambda c: c.x, lambda c, p: np.zeros((2, 3, 4, 4), np.float32)), "pack.shape", "'x' (uid 1)"),
    "rank": (_set(lambda c: c.b, lambda c, p: np.zeros((3,), np.float32)), "pack.shape", "'b' (uid 2)"),
    "strides": (_set(lambda c: c.x, lambda c, p: np.asfortranarray(p[c.x])), "pack.strides", "'x' (uid 1)"),
    "output strides": (
        _set(lambda c: c.w, lambda c, p: poison(np.empty(SHAPE[::-1], np.float32)).T),
        "pack.strides",
        "'w' (uid 7)",
    ),
    "dtype": (_set(lambda c: c.x, lambda c, p: p[c.x].astype(np.float64)), "pack.dtype", "'x' (uid 1)"),
    "output dtype": (
        _set(lambda c: c.y, lambda c, p: poison(np.empty(SHAPE, np.float16))),
        "pack.dtype",
        "'y' (uid 6)",
    ),
    "device": (_device, "pack.device", "'x' (uid 1)"),
    "not a buffer": (_set(lambda c: c.x, lambda c, p: p[c.x].tolist()), "pack.type", "'x' (uid 1)"),
    "unknown buffer type": (
        _set(lambda c: c.b, lambda c, p: np.zeros((1, 3, 1, 1), np.complex64)),
        "pack.dtype",
        "'b' (uid 2)",
    ),
    "misaligned strides": (
        _set(
            lambda c: c.b,
            lambda c, p: np.lib.stride_tricks.as_strided(
                np.zeros(16, np.float32), shape=(1, 3, 1, 1), strides=(4, 6, 4, 4)
            ),
        ),
        "pack.strides",
        "'b' (uid 2)",
    ),
    "read-only output": (_readonly, "pack.readonly", "'y' (uid 6)"),
    # y = (x + b) * s over x's own buffer is an in-place update through the pack: tests/test_inplace_pack.py
    "output overlaps input": (_overlap_in_out, "pack.overlap", "'y' (uid 6)"),
    "outputs overlap": (_overlap_out_out, "pack.overlap", "'w' (uid 7)"),
    "same output twice": (_set(lambda c: c.w, lambda c, p: p[c.y]), "pack.overlap", "'y' (uid 6)"),
    "pbv array": (_set(lambda c: c.s, lambda c, p: np.array([1.0, 2.0])), "pack.pass_by_value", "'s' (uid 3)"),
    "pbv string": (_set(lambda c: c.s, lambda c, p: "2.0"), "pack.pass_by_value", "'s' (uid 3)"),
    "pbv None": (_set(lambda c: c.s, lambda c, p: None), "pack.pass_by_value", "'s' (uid 3)"),
    "pbv complex": (_set(lambda c: c.s, lambda c, p: 2j), "pack.pass_by_value", "'s' (uid 3)"),
    "pbv list": (_set(lambda c: c.s, lambda c, p: [2.0]), "pack.pass_by_value", "'s' (uid 3)"),
}


@pytest.mark.parametrize("name", list(REJECTED))
def test_rejected_pack_writes_nothing(case, rng, name):
    mutate, rule, needle = REJECTED[name]
    p = case.pack(rng)
    snap = snapshot(p)
    mutate(case, p)
    snap += snapshot(p)
    with pytest.raises(og.VariantPackError) as ei:
        case.plan.execute(p)
    err = ei.value
    assert err.rule == rule, str(err)
    assert f"[rule {rule}]" in str(err) and needle in str(err), str(err)
    assert "What to do:" in str(err)
    assert_untouched(snap)  # inputs as they were, outputs still poisoned


def test_missing_lists_every_tensor(case, rng):
    p = case.pack(rng)
    snap = snapshot(p)
    with pytest.raises(og.VariantPackError) as ei:
        case.plan.execute({case.b: p[case.b]})
    text = str(ei.value)
    for needle in ("'x' (uid 1)", "'s' (uid 3)", "'k' (uid 4)", "'y' (uid 6)", "'w' (uid 7)", "5 tensor(s)"):
        assert needle in text
    assert "'b'" not in text.split("lacks")[1]
    assert_untouched(snap)


def test_ambiguous_name(rng):
    g = og.Graph(io_data_type=D.FLOAT)
    a = g.tensor(dim=[3], name="same")
    b = g.tensor(dim=[3], name="same")
    y = g.add(a, b).set_output(True).set_name("y")
    plan = g.build(device="cpu")
    out = poison(np.empty(3, np.float32))
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute({"same": np.ones(3, np.float32), b: np.ones(3, np.float32), "y": out})
    assert ei.value.rule == "pack.ambiguous_name" and "'same'" in str(ei.value)
    assert f"{a.uid}" in str(ei.value) and f"{b.uid}" in str(ei.value)
    assert np.isnan(out).all()


def test_handle_of_another_graph(case, rng):
    other = og.Graph(io_data_type=D.FLOAT)
    ox = other.tensor(dim=SHAPE, name="x", uid=1)  # same UID and name as case.x
    other.relu(ox).set_output(True)
    other.validate()
    p = case.pack(rng)
    p[ox] = p.pop(case.x)
    snap = snapshot(p)
    with pytest.raises(og.VariantPackError) as ei:
        case.plan.execute(p)
    assert ei.value.rule == "pack.unknown" and "'x' (uid 1)" in str(ei.value)
    assert_untouched(snap)


def test_pack_must_be_a_mapping(case):
    with pytest.raises(og.VariantPackError) as ei:
        case.plan.execute([1, 2, 3])
    assert ei.value.rule == "pack.type"


@pytest.mark.parametrize("fresh", [True, False])
def test_execute_none_says_what_to_pass(rng, fresh):
    """A fresh plan's binder once compared None with its last pack (None) and raised an untyped
    TypeError; now None is a variant pack of the wrong type, whether or not a pack was bound before."""
    c = Case()
    if not fresh:
        c.plan.execute(c.pack(rng))
    with pytest.raises(og.VariantPackError) as ei:
        c.plan.execute(None)
    assert ei.value.rule == "pack.type" and "NoneType" in str(ei.value)
    assert "every input and output" in str(ei.value)


def _image_plan(batch: int = 8):
    g = og.Graph("img", io_data_type=D.FLOAT)
    x = g.tensor(dim=[batch, 16, 12, 12], name="x")  # NCHW (packed row-major)
    w = g.tensor(dim=[16, 16, 1, 1], name="w")
    y = g.conv_fprop(x, w, padding=[0, 0]).set_output(True).set_name("y")
    return g.build(device="cpu"), x, w, y


def test_a_batch_the_plan_was_not_built_for_names_the_real_fix():
    plan, x, w, y = _image_plan(8)
    pack = {
        x: np.zeros((4, 16, 12, 12), np.float32),
        w: np.zeros((16, 16, 1, 1), np.float32),
        y: np.zeros((8, 16, 12, 12), np.float32),
    }
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack)
    assert ei.value.rule == "pack.shape"
    assert "build a plan for dims [4, 16, 12, 12]" in ei.value.hint and "reshape" not in ei.value.hint
    pack[x] = np.zeros((8, 16 * 12 * 12), np.float32)  # the same elements: a view fixes it
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack)
    assert "bind a buffer of shape [8, 16, 12, 12] (reshape or view it)" in ei.value.hint


def test_a_layout_mismatch_names_both_layouts_and_both_fixes():
    torch = pytest.importorskip("torch")
    plan, x, w, y = _image_plan(2)
    xv = torch.randn(2, 16, 12, 12).contiguous(memory_format=torch.channels_last)
    pack = {x: xv, w: torch.randn(16, 16, 1, 1), y: torch.empty(2, 16, 12, 12)}
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(pack)
    err = ei.value
    assert err.rule == "pack.strides"
    assert "layout is nhwc" in err.detail and "declared nchw" in err.detail
    assert f"stride={list(xv.stride())}" in err.hint and "buffer.contiguous()" in err.hint
    assert "channels_last" not in err.hint  # the call the user already made is not the fix
    pack[x] = xv.contiguous()
    plan.execute(pack)  # the fix the hint names works


def test_pass_by_value_holds_a_value_of_its_type(rng):
    """A HALF pass-by-value scalar given 0.1 acts as 0.1 in half, like a 1-element HALF buffer does."""
    g = og.Graph(io_data_type=D.DOUBLE)
    x = g.tensor(dim=[16], name="x")
    s_val = g.tensor(dim=[1], name="s_val", data_type=D.HALF, is_pass_by_value=True)
    s_mem = g.tensor(dim=[1], name="s_mem", data_type=D.HALF)
    big = g.tensor(dim=[1], name="big", is_pass_by_value=True, data_type=D.FLOAT)
    y1 = g.mul(x, s_val).set_output(True)
    y2 = g.mul(x, s_mem).set_output(True)
    y3 = g.mul(x, big).set_output(True)
    plan = g.build(device="cpu")
    xv = random_values(g.final.tensors[x.uid], rng)
    outs = [poison(np.empty(16)) for _ in range(3)]
    plan.execute(
        {x: xv, s_val: 0.1, s_mem: np.array([0.1], np.float16), big: 10**400, y1: outs[0], y2: outs[1], y3: outs[2]}
    )
    np.testing.assert_array_equal(outs[0], xv * float(np.float16(0.1)))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[2], np.sign(xv) * np.inf)
    with pytest.raises(og.VariantPackError) as ei:
        plan.execute(
            {
                x: xv,
                s_val: np.complex64(1),
                s_mem: np.array([0.1], np.float16),
                big: 1.0,
                y1: outs[0],
                y2: outs[1],
                y3: outs[2],
            }
        )
    assert ei.value.rule == "pack.pass_by_value" and "'s_val'" in str(ei.value)


@pytest.mark.gpu
def test_gpu_parameters_take_the_fast_path(rng):
    """A module's weights as nn.Parameter (as torch.compile passes them to the backend's plans) bind through
    the fast path, not the full check of every entry at every call."""
    import torch

    g = og.Graph("p", io_data_type=og.DataType.FLOAT)
    x, w = g.tensor(dim=[4, 8], name="x"), g.tensor(dim=[4, 8], name="w")
    g.mul(x, w, name="y").set_output(True)
    plan = g.build(device="cuda")
    weight = torch.nn.Parameter(torch.randn(4, 8, device="cuda"))
    xs, ys = torch.randn(4, 8, device="cuda"), torch.full((4, 8), float("nan"), device="cuda")
    y_uid = plan.graph.outputs[0]
    pack = {"x": xs, "w": weight, y_uid: ys}
    plan.execute(pack)
    torch.testing.assert_close(ys, xs * weight.detach())
    assert plan.local_state().binder._fast(pack) is not None


@pytest.mark.parametrize("seed", range(20))
def test_fast_path_overlap_sweep_agrees_with_every_pair(seed):
    """The CUDA fast path's overlap check (a sweep over the buffers sorted by address) finds exactly
    the pairs the every-output-against-every-buffer rule finds: outputs meeting any other buffer,
    unless an in-place pair starts at the same address."""
    from types import SimpleNamespace

    from opgraph.runtime.bindings import PackBinder

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 12))
    spans = []
    for uid in range(n):
        lo = int(rng.integers(0, 40 if seed % 2 else 400)) * 16  # (crowded and sparse)
        spans.append((lo, lo + int(rng.integers(0, 8)) * 16, uid))
    outputs = frozenset(int(u) for u in rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
    allowed = frozenset((int(a), int(b)) for a, b in rng.integers(0, n, size=(4, 2)))

    def every_pair() -> bool:
        for lo, hi, uid in spans:
            if uid not in outputs:
                continue
            for a, b, other in spans:
                if other != uid and a < hi and lo < b and not (a == lo and (other, uid) in allowed):
                    return True
        return False

    binder = SimpleNamespace(output_set=outputs, _allowed=allowed)
    assert PackBinder._overlap(binder, list(spans)) == every_pair()
