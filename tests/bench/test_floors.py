"""Floor arithmetic (bench.core.floors), on the CPU."""

from __future__ import annotations

import pytest

from bench.core.floors import (
    Ceilings,
    Floor,
    Layer,
    LayerRecord,
    bytes_us,
    datasheet,
    evaluate,
    math_us,
    roofline_layers,
    roofline_us,
)

CEIL = Ceilings(copy_gbps=3000.0, gemm_tflops={"float16": 660.0, "bfloat16": 600.0})


def test_units():
    assert bytes_us(3e9, 3000.0) == pytest.approx(1000.0)  # 3 GB at 3 TB/s: 1 ms
    assert math_us(660e12, 660.0) == pytest.approx(1e6)  # 660 TFLOP at 660 TFLOP/s: 1 s
    assert bytes_us(0, 3000.0) == 0.0 and math_us(1e9, None) == 0.0


def test_floor_is_the_larger_bound_and_names_it():
    f = evaluate(Floor(bytes=3e6, flops=660e6 * 10), CEIL)  # 1 µs of bytes, 10 µs of math
    assert f.kind == "math" and f.us == pytest.approx(10.0)
    f = evaluate(Floor(bytes=3e9, flops=660e6), CEIL)
    assert f.kind == "bytes" and f.us == pytest.approx(1000.0)


def test_math_uses_the_rate_of_the_workload_type():
    assert evaluate(Floor(flops=600e6, dtype="bfloat16"), CEIL).us == pytest.approx(1.0)
    assert evaluate(Floor(flops=660e6, dtype="float16"), CEIL).us == pytest.approx(1.0)


def test_alternative_byte_bound_is_stated_beside():
    f = evaluate(Floor(bytes=2 * 3e6, alt_bytes=(("two passes", 3 * 3e6),)), CEIL)
    assert f.us == pytest.approx(2.0) and f.terms["bytes (two passes)"] == pytest.approx(3.0)
    assert "bytes (two passes) 3.0" in f.text()


def test_per_layer_roofline_sums_each_layers_bound():
    layers = (Layer("bw", flops=660e6, bytes=30e6), Layer("math", flops=660e7, bytes=3e6))  # 10 µs, 10 µs
    assert roofline_us(layers, 3000.0, 660.0) == pytest.approx(20.0)
    f = evaluate(Floor(layers=layers), CEIL)
    assert f.kind == "per-layer roofline" and f.us == pytest.approx(20.0)
    assert f.terms["math"] == pytest.approx(11.0) and f.terms["bytes"] == pytest.approx(11.0)


def test_roofline_layers_inference_and_training():
    recs = [
        LayerRecord("gemm", "conv1", 100.0, 10.0, 20.0, 5.0, first=True),
        LayerRecord("norm", "bn1", 0, 20, 20, 2),
        LayerRecord("pool", "pool", 0, 20, 5),
        LayerRecord("gemm", "fc", 50.0, 5.0, 1.0, 3.0),
        LayerRecord("add", "block", 0, 7.0),
    ]
    inf = roofline_layers(recs)
    assert [x.name for x in inf] == ["conv1", "pool", "fc", "block"]  # the norm folds into conv1
    assert inf[0].bytes == 35.0 and inf[3].bytes == 7.0
    tr = roofline_layers(recs, training=True)
    names = [x.name for x in tr]
    assert "conv1.dgrad" not in names and "fc.dgrad" in names  # no input gradient for the network's input
    assert {"conv1.wgrad", "bn1", "bn1.bwd", "pool.bwd", "fc.sgd"} <= set(names)
    assert next(x for x in tr if x.name == "fc.sgd").bytes == 15.0  # w, v, g read; w, v written


def test_datasheet_most_specific_name_first():
    assert datasheet("NVIDIA H100 80GB HBM3")["hbm_gbps"] == 3350.0
    assert datasheet("NVIDIA H100 PCIe")["float16"] == 756.0
    assert datasheet("NVIDIA H200 NVL")["float16"] == 835.0
    assert datasheet("NVIDIA H200")["hbm_gbps"] == 4800.0
    assert datasheet("Some CPU") is None


def test_floor_round_trips_through_json_dicts():
    f = Floor(
        bytes=1.0, flops=2.0, dtype="bfloat16", alt_bytes=(("two passes", 3.0),), layers=(Layer("a", 1, 2),), note="n"
    )
    assert Floor.from_dict(f.to_dict()) == f
    assert Floor.from_dict(None) == Floor()


def test_bytes_use_the_faster_of_copy_and_read_and_old_records_load():
    """A read-mostly workload streams faster than a copy: the floor takes the faster rate (a floor
    above a measured time is no floor); records from before the read ceiling load without it."""
    both = Ceilings(copy_gbps=3000.0, gemm_tflops={"float16": 660.0}, read_gbps=4000.0)
    assert evaluate(Floor(bytes=4e9), both).us == pytest.approx(1000.0)
    assert evaluate(Floor(bytes=3e9), CEIL).us == pytest.approx(1000.0)  # no read rate: the copy's
    assert Ceilings.from_dict(both.to_dict()) == both
    old = Ceilings.from_dict({"copy_gbps": 3000.0, "gemm_tflops": {"float16": 660.0}})
    assert old.read_gbps is None and old.hbm_gbps == 3000.0 and "read_gbps" not in old.to_dict()
