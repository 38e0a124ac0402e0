"""cuDNN's bit-packed booleans (notebook 26: a ReLU bitmask [N, C, 1, 1] bound to a [N, C/8, 1, 1] uint8
buffer): outputs packed after the run, inputs unpacked before, eight values a byte, lowest bit first, in
the tensor's memory order."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import opgraph as og  # noqa: E402
from opgraph import cudnn  # noqa: E402
from opgraph.cudnn import bitmask  # noqa: E402


def _unpack(packed, n, c):
    bits = (packed.view(n, c // 8, 1).to(torch.int32) >> torch.arange(8, dtype=torch.int32)) & 1
    return bits.view(n, c).bool()


def test_a_relu_bitmask_output_is_bit_packed_in_memory_order():
    n, c = 6, 32
    x = torch.randn(n, c, 1, 1).to(memory_format=torch.channels_last)
    with cudnn.Graph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT) as g:
        out = g.relu(name="ReLU", input=x, lower_clip=0.0, upper_clip=1.0)
        lower = g.cmp_gt(name="lo", input=out, comparison=0.0).set_data_type(cudnn.data_type.BOOLEAN)
        upper = g.cmp_lt(name="hi", input=out, comparison=1.0).set_data_type(cudnn.data_type.BOOLEAN)
        mask = g.logical_and(name="and", a=lower, b=upper)
        out.set_name("output").set_output(True)
        mask.set_name("mask").set_output(True).set_data_type(cudnn.data_type.BOOLEAN)
    y = torch.full_like(x, float("nan"))
    packed = torch.full((n, c // 8, 1, 1), 0xA5, dtype=torch.uint8)  # poisoned
    g({"ReLU::input": x, "output": y, "mask": packed})
    want = (x > 0) & (x < 1)
    torch.testing.assert_close(y, x.clamp(0, 1))
    assert torch.equal(_unpack(packed, n, c), want.view(n, c))


def test_a_bit_packed_input_is_unpacked():
    n, c = 4, 16
    g = og.Graph("mul", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    dy = g.tensor(dim=[n, c, 1, 1], stride=[c, 1, c, c], name="dy")
    m = g.tensor(dim=[n, c, 1, 1], stride=[c, 1, c, c], name="m", data_type=og.DataType.BOOLEAN)
    g.mul(dy, m, name="dx").set_output(True)
    want = torch.rand(n, c) > 0.5
    values = torch.randn(n, c)
    packed = torch.zeros(n, c // 8, 1, 1, dtype=torch.uint8)
    bools = torch.empty_strided((n, c, 1, 1), (c, 1, c, c), dtype=torch.bool)
    bools.view(n, c).copy_(want)
    descs = {t.name: t for t in g.final.tensors.values()}
    bitmask.pack_into(descs["m"], bools, packed)
    assert torch.equal(_unpack(packed, n, c), want)
    assert torch.equal(bitmask.unpack(descs["m"], packed).view(n, c), want)
    assert bitmask.is_packed(descs["m"], packed) and not bitmask.is_packed(descs["dy"], packed)
    assert not bitmask.is_packed(descs["m"], bools)


def test_a_bit_packed_output_in_a_cuda_graph_is_refused():
    n, c = 2, 8
    g = og.Graph("cmp", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[n, c], name="x")
    g.cmp_gt(x, 0.0, name="m").set_output(True).set_data_type(og.DataType.BOOLEAN)
    desc = next(t for t in g.final.tensors.values() if t.data_type is og.DataType.BOOLEAN)
    with pytest.raises(og.VariantPackError, match="bit-packed"):
        bitmask.bind(desc, torch.zeros(n, c // 8, dtype=torch.uint8), True, None)


def test_a_bit_packed_input_runs_through_a_graph():
    n, c = 4, 16
    dy = torch.randn(n, c, 1, 1).to(memory_format=torch.channels_last)
    want = (torch.rand(n, c, 1, 1) > 0.5).to(memory_format=torch.channels_last)
    with cudnn.Graph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT) as g:
        g.mul(name="drelu", a=dy, b=want).set_name("dx").set_output(True)
    packed = torch.zeros(n, c // 8, 1, 1, dtype=torch.uint8)
    desc = next(t for t in g._require().final.tensors.values() if t.data_type is og.DataType.BOOLEAN)
    bitmask.pack_into(desc, want, packed)
    dx = torch.full_like(dy, float("nan"))
    g({"drelu::a": dy, "drelu::b": packed, "dx": dx})
    torch.testing.assert_close(dx, dy * want)
