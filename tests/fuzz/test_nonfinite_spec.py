"""The NaN / infinity / overflow spec (docs/concepts.md, "NaN, infinities and overflow"): the reference
engine's sums follow it, and the fuzzer's oracle accepts several answers exactly where it allows
them (oracle.order_sensitive, oracle.padding_terms)."""

from __future__ import annotations

import numpy as np
import pytest

import opgraph as og
from opgraph.ops.conv import ConvGeometry, ConvolutionMode, conv_data_grad, conv_forward

from . import oracle

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DT = og.DataType
F32_MAX = float(np.finfo(np.float32).max)
CROSS = ConvolutionMode.CROSS_CORRELATION


def _node(build):
    """The one node of a small graph (and its final graph)."""
    g = og.Graph("spec", io_data_type=DT.FLOAT, intermediate_data_type=DT.FLOAT, compute_data_type=DT.FLOAT)
    build(g).set_output(True)
    final = g.final
    return final.nodes[0], final


def _matmul(m: int, k: int, n: int):
    return _node(
        lambda g: g.matmul(
            g.tensor(dim=[m, k], stride=[k, 1], data_type=DT.FLOAT),
            g.tensor(dim=[k, n], stride=[n, 1], data_type=DT.FLOAT),
        )
    )


def _sensitive(node, final, *ins):
    descs = [final.tensors[u] if u is not None else None for u in node.outputs]
    return oracle.order_sensitive(node, [np.asarray(a, dtype=np.float64) for a in ins], descs)


def test_reference_sums_follow_ieee():
    geo = ConvGeometry((1,), (1,), (1,), (1,))
    w = np.ones((1, 1, 3))
    w[0, 0, 0] = np.nan  # meets the padding at output 0: the reference computes 0 * NaN
    y = conv_forward(np.ones((1, 1, 4)), w, geo, CROSS)
    assert np.isnan(y).all()
    w[0, 0, 0] = np.inf  # inf * (padding) 0 = NaN at output 0; inf elsewhere
    y = conv_forward(np.ones((1, 1, 4)), w, geo, CROSS)
    assert np.isnan(y[0, 0, 0]) and np.all(y[0, 0, 1:] == np.inf)
    # dgrad sums only the (o, r) pairs that meet: a NaN tap does not reach the stride holes it skips
    w = np.ones((1, 1, 3))
    w[0, 0, 1] = np.nan
    dx = conv_data_grad(np.ones((1, 1, 2)), w, (1, 1, 5), ConvGeometry((0,), (0,), (2,), (1,)), CROSS)
    assert np.isnan(dx[0, 0, [1, 3]]).all() and np.isfinite(dx[0, 0, [0, 2, 4]]).all()
    node, final = _matmul(1, 2, 1)
    (c,) = node.op.reference([np.array([[np.inf, 1.0]]), np.array([[0.0], [1.0]])], [final.tensors[node.outputs[0]]])
    assert np.isnan(c).all()  # inf * 0
    (c,) = node.op.reference(
        [np.array([[np.inf, 1.0]]), np.array([[1.0], [-np.inf]])], [final.tensors[node.outputs[0]]]
    )
    assert np.isnan(c).all()  # +inf and -inf among the terms


def test_a_sum_that_can_overflow_fp32_in_some_order_is_order_sensitive():
    node, final = _matmul(2, 3, 1)
    a = np.array(
        [
            [3e38, 3e38, -3e38],  # exact sum 3e38, but 3e38 + 3e38 overflows fp32 first
            [1.0, 2.0, 3.0],
        ]
    )
    b = np.ones((3, 1))
    (hot,) = _sensitive(node, final, a, b)
    assert hot is not None and hot[0, 0] and not hot[1, 0]


def test_nan_in_every_order_is_not_order_sensitive():
    node, final = _matmul(3, 3, 1)
    a = np.array(
        [
            [3e38, 3e38, np.nan],  # NaN whatever the order: must be NaN
            [np.inf, -np.inf, 1.0],  # +inf and -inf: NaN in every order
            [np.inf, 0.0, 1.0],
        ]
    )  # inf * 0: NaN in every order
    b = np.array([[1.0], [1.0], [1.0]])
    b2 = np.array([[1.0], [1.0], [0.0]])
    (hot,) = _sensitive(node, final, a, b)
    assert hot is None or not hot[:2].any()
    (hot,) = _sensitive(node, final, a, b2)  # row 0 is NaN * 0 = NaN; row 2: inf * 1 + 0 * 1 + 1 * 0 = inf
    assert hot is None or not hot.any()


def test_padding_terms_of_convolutions_may_be_either():
    def conv(g):
        x = g.tensor(dim=[1, 1, 4], stride=[4, 4, 1], data_type=DT.FLOAT)
        w = g.tensor(dim=[1, 1, 3], stride=[3, 3, 1], data_type=DT.FLOAT)
        return g.conv_fprop(x, w, padding=[1], stride=[1], dilation=[1])

    node, final = _node(conv)
    descs = [final.tensors[node.outputs[0]]]
    w = np.array([[[np.nan, 1.0, 1.0]]])  # tap 0 meets the padding only at output 0
    pad = oracle.padding_terms(node, [np.ones((1, 1, 4)), w], descs)
    assert pad is not None and pad[0, 0, 0] and not pad[0, 0, 1:].any()
    assert oracle.padding_terms(node, [np.ones((1, 1, 4)), np.ones((1, 1, 3))], descs) is None


def test_an_oracle_with_the_spec_still_catches_a_lost_nan():
    """The sensitivity runs widen the tolerance only where the spec allows it: an engine that drops
    a NaN from a plain matmul row is still a mismatch."""
    node, final = _matmul(2, 2, 1)
    uid_a, uid_b = node.input_uids()
    a = np.array([[np.nan, 1.0], [1.0, 2.0]])
    b = np.array([[1.0], [1.0]])
    want = oracle.evaluate(final, {uid_a: a, uid_b: b}, None)
    out = node.outputs[0]
    rng = np.random.default_rng(0)
    spread = np.zeros(final.tensors[out].dim)
    for _ in range(4):
        nudged = oracle.evaluate(final, {uid_a: a, uid_b: b}, rng)
        spread = np.maximum(spread, np.nan_to_num(np.abs(nudged[out] - want[out]), nan=0.0))
    got = want[out].copy()
    got[0, 0] = 0.0
    assert oracle.compare(final.tensors[out], got, want[out], spread) is not None
