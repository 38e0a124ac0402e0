"""IEEE special values and conversions of compound values, where the fuzzer found engines wrong
(tests/fuzz/regressions/seed2026112550*.json):

- POW is C99's pow (opgraph.ops.pointwise) on every engine: 1 ** nan and (+-1) ** +-inf are 1,
  (-inf) ** y follows y's sign and parity (not NaN for a non-integer y), 0 ** nan is NaN, (-0) ** y
  keeps the sign for odd y; the reference itself must not depend on the exponent's shape (NumPy takes
  sqrt for a one-element exponent of 0.5: (-inf) ** 0.5 would be NaN, (-0) ** 0.5 would be -0);
- a fused batchnorm backward rounds dscale = inv * sum(dy * (x - mean)) once to its type: the cast
  applied to the sum alone overflowed fp16 where the product does not.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import opgraph as og
from opgraph.engines.triton.casts import from_storage, operand, to_storage
from opgraph.testing import reference_outputs

from ..helpers import requires_interpreter

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
D = og.DataType
SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, np.inf, -np.inf, np.nan]
CPU = [pytest.mark.interpreter, requires_interpreter]
# (device, engine): the CPU runs generated kernels under Triton's interpreter; the GPU compiles them
ENGINES = [
    pytest.param(("cpu", "triton"), marks=CPU, id="triton"),
    pytest.param(("cpu", "torch"), marks=CPU, id="torch"),
    pytest.param(("cpu", "reference"), marks=CPU, id="reference"),
    pytest.param(("cuda", "triton"), marks=pytest.mark.gpu, id="cuda-triton"),
    pytest.param(("cuda", "torch"), marks=pytest.mark.gpu, id="cuda-torch"),
]


def c_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C99 pow in float64, elementwise over full-size operands (PyTorch's CPU pow)."""
    import torch

    x, y = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64))
    return torch.pow(torch.tensor(x.copy()), torch.tensor(y.copy())).numpy()


def assert_same_specials(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    """NaN where want is NaN, infinities and zeros with their signs, others within rtol."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=0, equal_nan=True, err_msg=what)
    exact = (want == 0) | np.isinf(want)
    bad = exact & (np.signbit(got) != np.signbit(want))
    assert not bad.any(), f"{what}: signs differ at {np.flatnonzero(bad)}: got {got[bad]}, want {want[bad]}"


def _run(g: og.Graph, where: tuple[str, str], inputs: dict, out: og.Tensor, dt: D) -> np.ndarray:
    """`out` of g built for (device, engine) on `inputs` (NumPy arrays or Python numbers), poisoned first."""
    device, engine = where
    plan = g.build(device=device, engines=[engine])
    pack = dict(inputs)
    pack[out] = np.full(out.dim, np.nan, dtype=dt.numpy)
    if device == "cpu":
        plan.execute(pack)
        return pack[out]
    import torch

    from opgraph.core.torch_interop import torch_to_numpy

    on = {t: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for t, v in pack.items()}
    plan.execute(on)
    torch.cuda.synchronize()
    return torch_to_numpy(on[out].cpu())


@pytest.mark.parametrize("where", ENGINES)
@pytest.mark.parametrize("dt", [D.FLOAT, D.DOUBLE], ids=lambda d: d.name)
def test_pow_of_special_values_is_c99_pow(where, dt):
    pairs = np.array(list(itertools.product(SPECIAL, SPECIAL)))
    xs, ys = pairs[:, 0].astype(dt.numpy), pairs[:, 1].astype(dt.numpy)
    g = og.Graph(io_data_type=dt, intermediate_data_type=dt, compute_data_type=dt)
    x = g.tensor(dim=[len(pairs)], name="x")
    y = g.tensor(dim=[len(pairs)], name="y")
    z = g.pow(x, y).set_output(True).set_name("z")
    got = _run(g, where, {x: xs, y: ys}, z, dt)
    want = c_pow(xs, ys)
    assert_same_specials(got, want, 1e-6 if dt is D.FLOAT else 1e-14, f"pow on {where}, {dt.name}")


@pytest.mark.parametrize("where", ENGINES)
@pytest.mark.parametrize("how", ["by_value", "one_element", "literal"])
def test_pow_by_a_one_element_exponent_of_one_half(where, how):
    """(-inf) ** 0.5 = inf and (-0) ** 0.5 = +0, however the exponent is given (NumPy's and PyTorch's
    sqrt shortcut for a scalar 0.5 gives NaN and -0)."""
    xs = np.array([-np.inf, -0.0, 4.0, -4.0, np.inf, 0.0, np.nan])
    g = og.Graph(io_data_type=D.DOUBLE, intermediate_data_type=D.DOUBLE, compute_data_type=D.DOUBLE)
    x = g.tensor(dim=[xs.size], name="x")
    inputs: dict = {x: xs}
    if how == "literal":
        e: object = 0.5
    else:
        e = g.tensor(dim=[1], name="e", is_pass_by_value=how == "by_value")
        inputs[e] = 0.5 if how == "by_value" else np.array([0.5])
    z = g.pow(x, e).set_output(True).set_name("z")
    got = _run(g, where, inputs, z, D.DOUBLE)
    assert_same_specials(got, c_pow(xs, np.full(xs.size, 0.5)), 1e-15, f"pow(x, 0.5) on {where}")


@pytest.mark.parametrize("where", ENGINES)
def test_pow_of_a_literal_signed_zero_base(where):
    """A literal base: (-0) ** y is -inf for an odd negative y and -0 for an odd positive one."""
    ys = np.array([-1.0, -2.0, 3.0, 2.0, 0.5, -0.5, np.nan, 0.0, -np.inf, np.inf])
    g = og.Graph(io_data_type=D.FLOAT, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT)
    y = g.tensor(dim=[ys.size], name="y")
    z = g.pow(-0.0, y).set_output(True).set_name("z")
    got = _run(g, where, {y: ys.astype(np.float32)}, z, D.FLOAT)
    assert_same_specials(got, c_pow(np.full(ys.size, -0.0), ys), 0.0, f"pow(-0, y) on {where}")


def test_conversions_apply_to_the_whole_value():
    """`.to(...)` after a compound expression converts all of it, not its last factor."""
    assert to_storage("inv * t_e", D.HALF, "tl.float32") == "(inv * t_e).to(tl.float16)"
    assert from_storage("a + b", D.FLOAT, "tl.float64") == "(a + b).to(tl.float64)"
    for atom in ("v5", "tl.load(p + o, mask=m)", "(a + b)", "_og_from_bf16(tl.load(p))"):
        assert operand(atom) == atom
    for compound in ("f(a) * g(b)", "(a) + (b)", "-v3", "tl.where(m, a, b) + 1"):
        assert operand(compound) == f"({compound})"


@pytest.mark.parametrize("where", ENGINES[:2] + ENGINES[3:])
def test_batchnorm_backward_dscale_near_the_top_of_fp16(where, rng):
    """dscale = inv * sum(dy * (x - mean)) below fp16's largest value while the sum is above it."""
    n, c = 4, 2
    g = og.Graph(io_data_type=D.FLOAT, intermediate_data_type=D.FLOAT, compute_data_type=D.FLOAT)
    dy = g.tensor(dim=[n, c, 2, 2], name="dy")
    x = g.tensor(dim=[n, c, 2, 2], name="x")
    per = dict(dim=[1, c, 1, 1])
    scale, mean, inv = (g.tensor(**per, name=k) for k in ("scale", "mean", "inv"))
    dx, dscale, dbias = g.batchnorm_backward(dy, x, scale, mean, inv)
    dx.set_output(True)
    dscale.set_output(True).set_data_type(D.HALF).set_name("dscale")
    dbias.set_output(True)
    xs = rng.uniform(0.5, 1.0, (n, c, 2, 2)).astype(np.float32)
    dys = np.full((n, c, 2, 2), 9000.0, dtype=np.float32)  # sum(dy * x) ~ 1e5 per channel
    pack = {
        dy: dys,
        x: xs,
        scale: rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32),
        mean: np.zeros((1, c, 1, 1), np.float32),
        inv: np.full((1, c, 1, 1), 0.5, np.float32),
    }
    final = g.final
    for t in (dx, dscale, dbias):
        pack[t] = np.full(t.dim, np.nan, dtype=final.tensors[t.uid].data_type.numpy)
    want = reference_outputs(final, {t.uid: v for t, v in pack.items()})[dscale.uid].astype(np.float64)
    assert (np.abs(want) > 30000).all() and np.isfinite(want).all()
    got = _run(g, where, {t: v for t, v in pack.items() if t is not dscale}, dscale, D.HALF)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3)


@pytest.mark.parametrize("where", ENGINES)
def test_neg_and_literal_negative_zero_keep_signs(where):
    """-x flips the sign of zeros, a literal -0.0 stays -0.0, and pow of two literals is folded as the
    reference computes it (Triton 3.6 computes -x as 0 - x and turns a float constant equal to 0 into
    +0.0: generated code negates by * -1.0 and writes -0.0 from its bits)."""
    g = og.Graph("signs", io_data_type=D.FLOAT)
    x = g.tensor(dim=[4], name="x")
    neg = g.neg(x).set_output(True)
    by_zero = g.div(g.add(g.mul(x, 0.0), 1.0), -0.0).set_output(True)  # 1 / -0.0 = -inf
    folded = g.add(g.mul(x, 0.0), g.pow(-0.0, -1.0)).set_output(True)  # 0 * x + (-inf)
    xs = np.array([0.0, -0.0, 1.5, -2.0], np.float32)
    plan = g.build(device=where[0], engines=[where[1]])
    pack = {x: xs}
    for t in (neg, by_zero, folded):
        pack[t] = np.full(t.dim, np.nan, np.float32)
    if where[0] == "cpu":
        plan.execute(pack)
        got = [pack[t] for t in (neg, by_zero, folded)]
    else:
        import torch

        dev = {k: torch.tensor(v, device="cuda") for k, v in pack.items()}
        plan.execute(dev)
        got = [dev[t].cpu().numpy() for t in (neg, by_zero, folded)]
    with np.errstate(all="ignore"):
        assert_same_specials(got[0], -xs.astype(np.float64), 0.0, f"neg on {where}")
        assert_same_specials(got[1], np.full(4, -np.inf), 0.0, f"1 / -0.0 on {where}")
        assert_same_specials(got[2], np.full(4, -np.inf), 0.0, f"pow(-0.0, -1.0) on {where}")
