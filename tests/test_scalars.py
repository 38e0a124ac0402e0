"""Pass-by-value scalars: one semantics in both binders (the full check and the fast path of repeated
CUDA packs), rounded to their declared type on every execute, and checked at run time by the rules a
literal of the same role meets at validation (a NaN or negative epsilon, a momentum outside [0, 1]).
Also: buffers of kinds opgraph cannot bind (sparse, nested...) are VariantPackErrors."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from types import SimpleNamespace

from opgraph.runtime.bindings import PackBinder, bind
from opgraph.core.device import Device
from opgraph.core.tensor import packed_strides
from opgraph.testing import poison, random_values

D = og.DataType
CUDA = Device("cuda", 0, "fake", (9, 0), 132)  # PackBinder needs no GPU to be built


class FakeCudaTensor:
    """What PackBinder's fast path reads of a torch CUDA tensor, without a GPU."""

    def __init__(self, dim, dtype, ptr):
        import torch

        self.shape = torch.Size(dim)
        self.dtype = dtype
        self.is_cuda = True
        self.device = SimpleNamespace(index=0)
        self._stride = tuple(int(s) for s in packed_strides(dim))
        self._ptr = ptr

    def stride(self):
        return self._stride

    def data_ptr(self):
        return self._ptr


def _scaled():
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4], name="x")
    s = g.tensor(dim=[1], name="s", data_type=D.FLOAT, is_pass_by_value=True)
    y = g.mul(x, s).set_output(True).set_name("y")
    return g, x, s, y


def test_fast_binder_rounds_pass_by_value_scalars_as_the_full_binder_does():
    torch = pytest.importorskip("torch")
    g, x, s, y = _scaled()
    final = g.final
    fast = PackBinder(final, CUDA)
    fast.tensor_types = frozenset({FakeCudaTensor})
    pack = {x: FakeCudaTensor([4], torch.float32, 4096), y: FakeCudaTensor([4], torch.float32, 8192), s: 0.1}
    fast._learn(pack)  # the keys, as a first (full) bind of this pack would have learnt them
    assert fast._fast(pack) is not None, "the fast path declined a plain pack"
    fast.bind(pack)
    full = bind(final, Device("cpu"), {x: np.ones(4, np.float32), y: np.zeros(4, np.float32), s: 0.1})
    want = float(np.float32(0.1))
    assert full[s.uid] == want
    got = fast.values
    assert got[s.uid] == want, f"fast binder passed {got[s.uid]!r}, the full binder {full[s.uid]!r}"
    fast.bind(pack)  # the same dict again: the cached answer
    assert fast.values[s.uid] == want


def test_fast_binder_checks_run_time_scalars():
    torch = pytest.importorskip("torch")
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 3, 4], name="x")
    eps = g.tensor(dim=[1], name="eps", is_pass_by_value=True)
    y, *_ = g.layernorm("INFERENCE", x, g.tensor(dim=[1, 3, 4], name="scale"), epsilon=eps)
    y.set_output(True).set_name("y")
    final = g.final
    fast = PackBinder(final, CUDA)
    fast.tensor_types = frozenset({FakeCudaTensor})
    pack = {
        u: FakeCudaTensor(final.tensors[u].dim, torch.float32, 4096 * (i + 1))
        for i, u in enumerate((*final.inputs, *final.outputs))
        if not final.tensors[u].is_pass_by_value
    }
    pack[eps.uid] = 1e-5
    fast._learn(pack)
    assert fast._fast(pack) is not None
    fast.bind(pack)
    pack[eps.uid] = -1e-5
    with pytest.raises(og.VariantPackError, match="epsilon") as info:
        fast.bind(pack)
    assert info.value.rule == "norm.epsilon"


@pytest.mark.parametrize("bad", [float("nan"), -1e-3])
def test_pass_by_value_epsilon_is_checked_like_a_literal(bad, rng):
    def graph(eps_value):
        g = og.Graph(io_data_type=D.FLOAT)
        x = g.tensor(dim=[3, 4, 5], name="x")
        eps = g.tensor(dim=[1], name="eps", is_pass_by_value=True) if eps_value is None else eps_value
        y, *_ = g.layernorm("INFERENCE", x, g.tensor(dim=[1, 4, 5], name="scale"), epsilon=eps)
        y.set_output(True).set_name("y")
        return g

    with pytest.raises(og.AttributeValueError) as literal:
        graph(bad).validate()
    assert literal.value.rule == "norm.epsilon"
    g = graph(None)
    plan = g.build(device="cpu")
    f = g.final
    pack = {
        "x": random_values(f.tensor("x"), rng),
        "scale": random_values(f.tensor("scale"), rng),
        "eps": bad,
        "y": poison(np.empty(f.tensor("y").dim, np.float32)),
    }
    with pytest.raises(og.VariantPackError) as info:
        plan.execute(pack)
    err = info.value
    assert err.rule == "norm.epsilon" and "'eps'" in str(err) and "layernorm" in str(err)
    assert np.isnan(pack["y"]).all(), "a rejected pack wrote an output"
    pack["eps"] = 1e-5
    plan.execute(pack)
    assert np.isfinite(pack["y"]).all()


def test_pass_by_value_momentum_is_checked(rng):
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[4, 3, 2], name="x")
    c = [1, 3, 1]
    m = g.tensor(dim=[1], name="m", is_pass_by_value=True)
    outs = g.batchnorm(
        x,
        g.tensor(dim=c, name="scale"),
        g.tensor(dim=c, name="bias"),
        g.tensor(dim=c, name="rm"),
        g.tensor(dim=c, name="rv"),
        epsilon=1e-5,
        momentum=m,
    )
    for i, t in enumerate(outs):
        t.set_output(True).set_name(f"o{i}")
    plan = g.build(device="cpu")
    f = g.final
    pack = {u: random_values(f.tensors[u], rng) for u in f.inputs if not f.tensors[u].is_pass_by_value}
    pack.update({u: poison(np.empty(f.tensors[u].dim, np.float32)) for u in f.outputs})
    pack[m.uid] = 1.5
    with pytest.raises(og.VariantPackError) as info:
        plan.execute(pack)
    assert info.value.rule == "norm.momentum"
    pack[m.uid] = 0.1
    plan.execute(pack)


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "nested", "memoryview", "object"])
def test_unsupported_buffer_kinds_are_variant_pack_errors(kind):
    torch = pytest.importorskip("torch")
    g = og.Graph(io_data_type=D.FLOAT)
    x = g.tensor(dim=[2, 3], name="x")
    y = g.relu(x).set_output(True).set_name("y")
    plan = g.build(device="cpu")
    make = {
        "sparse_coo": lambda: torch.ones(2, 3).to_sparse(),
        "sparse_csr": lambda: torch.ones(2, 3).to_sparse_csr(),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(3), torch.ones(3)]),
        "memoryview": lambda: memoryview(np.ones((2, 3), np.float32)),
        "object": lambda: np.ones((2, 3), dtype=object),
    }[kind]
    out = poison(np.empty((2, 3), np.float32))
    with pytest.raises(og.VariantPackError) as info:
        plan.execute({x: make(), y: out})
    assert "'x'" in str(info.value)
    assert np.isnan(out).all()
