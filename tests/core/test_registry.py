"""The registry helper: a name registered twice with different things is a typed error naming both;
the same thing again is a no-op; replace=True replaces on purpose. Every registry of opgraph is one."""

from __future__ import annotations

import pytest

import opgraph as og
from opgraph.core.errors import RegistrationError
from opgraph.core.registry import Registry


def _first(x):
    return x


def _second(x):
    return x


def test_a_second_registration_under_a_name_is_refused_and_names_both():
    reg: Registry[str, object] = Registry("widget")
    reg.register("a", _first)
    reg.register("a", _first)  # the same thing again: nothing happens
    with pytest.raises(RegistrationError) as err:
        reg.register("a", _second)
    text = str(err.value)
    assert err.value.rule == "registry.duplicate" and "widget 'a'" in text
    assert "test_registry._first" in text and "test_registry._second" in text and "replace=True" in text
    assert reg["a"] is _first
    reg.register("a", _second, replace=True)
    assert reg["a"] is _second and isinstance(err.value, og.GraphError)


def test_identity_function_decides_what_is_the_same():
    reg: Registry[str, tuple] = Registry("pair", same=lambda v: v[0])
    reg.register("k", (_first, 1))
    reg.register("k", (_first, 2))  # the same identity: accepted
    assert reg["k"] == (_first, 2)
    with pytest.raises(RegistrationError):
        reg.register("k", (_second, 1))


def test_every_registry_of_opgraph_refuses_duplicates():
    import opgraph.autodiff.rules as rules
    import opgraph.backend.lowering as lowering
    import opgraph.core.op as op
    import opgraph.engines as engines
    import opgraph.engines.torch_engine.common as torch_common
    import opgraph.ops.custom as custom

    tables = [
        op.OPS,
        op.BUILDERS,
        engines.ENGINES,
        torch_common.IMPLS,
        rules.RULES,
        rules.POINTWISE_RULES,
        rules.CUSTOM_RULES,
        custom.CUSTOM_OPS,
        lowering.LOWER,
    ]
    try:
        from opgraph.frontends import torch_ops
    except ImportError:  # (torch missing)
        pass
    else:
        tables += [torch_ops.TRANSLATORS, torch_ops.PREPARE]
    assert all(isinstance(t, Registry) for t in tables)


def test_an_op_kind_or_builder_registered_twice_is_refused():
    from dataclasses import dataclass

    from opgraph.core.op import BUILDERS, OPS, Op, graph_method, register_op

    @dataclass(frozen=True, kw_only=True)
    class NotMatmul(Op):
        kind = "matmul"

    with pytest.raises(RegistrationError) as err:
        register_op(NotMatmul)
    assert "op kind 'matmul'" in str(err.value) and OPS["matmul"].__name__ == "Matmul"

    def matmul(self, A, B):  # noqa: N803
        return None

    with pytest.raises(RegistrationError):
        graph_method(matmul)
    assert BUILDERS["matmul"] is not matmul


def test_a_rule_or_engine_registered_twice_is_refused():
    from opgraph.autodiff import register_rule
    from opgraph.engines import get_engine, register_engine

    with pytest.raises(RegistrationError):
        register_rule("matmul")(lambda ctx: {})
    reference = get_engine("reference")
    register_engine(type(reference)())  # a fresh instance of the same engine: the same engine

    class Impostor(type(reference)):  # type: ignore[misc]
        pass

    with pytest.raises(RegistrationError):
        register_engine(Impostor())


def test_a_translator_registered_twice_is_refused():
    pytest.importorskip("torch")
    from opgraph.frontends import torch_ops, torch_ops_lm  # noqa: F401  (every translator module registered)

    assert torch_ops.TRANSLATORS["masked_fill"] is torch_ops._masked_fill  # once, beside `where`
    with pytest.raises(RegistrationError):
        torch_ops.op("masked_fill")(lambda imp, node, a: None)


def test_a_custom_op_is_registered_once_unless_replaced(custom_ops_restored):
    import numpy as np

    def ref(x):
        return 2 * x

    first = og.register_custom_op("twice_reg", num_inputs=1, reference=ref, pointwise=True)
    assert og.register_custom_op("twice_reg", num_inputs=1, reference=ref, pointwise=True) == first
    with pytest.raises(RegistrationError) as err:
        og.register_custom_op("twice_reg", num_inputs=1, reference=lambda x: 3 * x, pointwise=True)
    assert "custom op 'twice_reg'" in str(err.value)
    og.register_custom_op("twice_reg", num_inputs=1, reference=lambda x: 3 * x, pointwise=True, replace=True)
    g = og.Graph("r", io_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[2, 3], name="x")
    y = g.custom("twice_reg", x).set_output(True)
    plan = g.build(device="cpu", engines=["reference"])
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    out = np.zeros((2, 3), np.float32)
    plan.execute({x: xv, y: out})
    np.testing.assert_array_equal(out, 3 * xv)
