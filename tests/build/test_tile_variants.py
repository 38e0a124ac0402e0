"""Tile variants of a dynamic plan's bucket (opgraph.build.tile_variants): a bucket's GEMM step carries a
few other tiles, found where the estimate at the bucket's small shapes beats the bucket's own by GAIN;
each shape runs the config of least estimate; the variants compile with the bucket's first shape, and
a shape running one equals the reference engine (the interpreter: tiles given by hand, as the CPU has no
estimates)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

import opgraph as og
import opgraph.build.bucket_plan as bucket_plan
from opgraph.build import tile_variants
from opgraph.build.buckets import choose
from opgraph.build.tile_variants import GAIN, TileChoice, offer
from opgraph.core.config import EngineConfig, HeurMode
from opgraph.core.device import CPU, Device
from opgraph.core.piece import make_piece
from opgraph.engines import get_engine
from opgraph.testing import compare, random_pack, reference_outputs
from tests.helpers import requires_cuda, requires_interpreter, run_at_shape

DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)


def _o_proj(batch: og.Dim, seq: og.Dim) -> og.FinalGraph:
    g = og.Graph("o_proj", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[batch, seq, 1024], name="x")
    g.matmul(x, g.tensor(dim=[1, 1024, 1024], stride=[1 << 20, 1, 1024], name="w")).set_output(True)
    return g.final


def _hint_piece(final: og.FinalGraph):  # type: ignore[no-untyped-def]
    (bucket,) = choose(final, "one").buckets
    hint = final.in_bucket(bucket.hint_map, bucket)
    return make_piece(hint, 0, hint.nodes)


def _tile(config: EngineConfig) -> tuple[int, int]:
    return config.knob("BLOCK_M"), config.knob("BLOCK_N")


def test_a_projection_over_small_and_large_shapes_carries_a_small_tile():
    """A Llama projection over batch 2-16 x seq 17-256 (hint 6 x 64): the bucket's tile is weighed over the
    bucket (128 x 128); at its small end (2 x 17 rows) 64 x 32 tiles (K split by 4 at the bottom, whole a
    quarter of the way up) are estimated at most GAIN of it, so the step carries them; 3 x 20 runs one,
    16 x 256 the bucket's own."""
    piece = _hint_piece(_o_proj(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)))
    engine = get_engine("triton")
    own = engine.configs(piece, H200, HeurMode.A)[0]
    choice = offer(piece, own, H200)
    assert choice is not None and choice.configs[0] is own and choice.variants
    assert _tile(own) == (128, 128) and all(_tile(v) == (64, 32) for v in choice.variants)
    assert all(v.numerical_notes == own.numerical_notes for v in choice.variants)
    assert choice.at({"batch": 3, "seq": 20}) in choice.variants and choice.at({"batch": 16, "seq": 256}) is None
    small = {"batch": 2, "seq": 17}
    est_own, est_variant = (engine.estimator(piece, c, H200) for c in (own, choice.variants[0]))
    assert est_own is not None and est_variant is not None
    assert est_variant(small) <= GAIN * est_own(small)  # type: ignore[operator]
    ranked = engine.configs_at(piece, H200, small)
    assert ranked[0].knobs == choice.variants[0].knobs  # (only tiles whose one kernel serves the bucket: no
    assert all(not c.knob("TMA") or c.knob("TMA_HOST") for c in ranked)  # device-side TMA)


def _down_proj_rms(batch: og.Dim, seq: og.Dim) -> og.Graph:
    """A Llama block's down projection (K 2816) with the residual and the next RMSNorm's mean of squares."""
    g = og.Graph("down_proj", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x = g.tensor(dim=[batch, seq, 2816], name="x")
    w = g.tensor(dim=[1, 2816, 1024], stride=[2816 << 10, 1, 2816], name="w")
    h = g.add(g.matmul(x, w), g.tensor(dim=[batch, seq, 1024], name="residual"))
    h.set_output(True)
    g.reduction(g.mul(h, h), mode="AVG").set_output(True).set_dim([batch, seq, 1])
    return g


def test_a_down_projection_over_short_requests_carries_a_split_k_tile():
    """The serving Llama's down projection at 3 x 20 tokens: the static plan splits K by 4 over 64 x 32 tiles
    (12.8 µs against 18.4 unsplit, H200, 2026-12-01); the bucket's step carries that split config, whose
    partials are laid out for the bucket's 4,096 rows (64 MiB), and runs it at the short requests."""
    piece = _hint_piece(_down_proj_rms(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)).final)
    engine = get_engine("triton")
    own = engine.configs(piece, H200, HeurMode.A)[0]
    choice = offer(piece, own, H200)
    assert choice is not None and own.knob("SPLIT_K") in (None, 1)
    split = [v for v in choice.variants if (v.knob("SPLIT_K") or 1) > 1]
    assert split and choice.at({"batch": 3, "seq": 20}) in split
    assert choice.at({"batch": 16, "seq": 256}) is None
    generated = engine.generated(piece, split[0], H200)
    assert generated.sized and generated.scratch_bytes >= split[0].knob("SPLIT_K") * 4096 * 1024 * 4


def test_a_wide_bucket_of_long_sequences_carries_tiles_for_its_short_end():
    """Batch 2-16 x seq 257-2048 (hint 6 x 720): the bucket's 128 x 256 tile is estimated 1.7x a 64 x 64 one
    at 2 x 257 rows and 1.4x a 128 x 128 one at its next point: both carried, each run where it wins; the
    middle and the top run the bucket's own."""
    engine = get_engine("triton")
    piece = _hint_piece(_o_proj(og.Dim("batch", 2, 16), og.Dim("seq", 257, 2048)))
    own = engine.configs(piece, H200, HeurMode.A)[0]
    choice = offer(piece, own, H200)
    assert choice is not None and _tile(own) == (128, 256)
    assert [_tile(v) for v in choice.variants] == [(64, 64), (128, 128)]
    at = {env: choice.at(dict(zip(("batch", "seq"), env))) for env in [(2, 257), (3, 400), (6, 720), (16, 2048)]}
    assert [None if c is None else _tile(c) for c in at.values()] == [(64, 64), (128, 128), None, None]


def test_a_narrow_bucket_or_a_static_piece_carries_none():
    """Where the bucket's tile is the best at its small end too (batch 8-16 x seq 1024-2048), or the piece
    is static, or there is no estimate (the CPU), nothing is offered."""
    engine = get_engine("triton")
    large = _hint_piece(_o_proj(og.Dim("batch", 8, 16), og.Dim("seq", 1024, 2048)))
    assert offer(large, engine.configs(large, H200, HeurMode.A)[0], H200) is None
    static = og.Graph("static", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    static.matmul(static.tensor(dim=[3, 20, 1024]), static.tensor(dim=[1, 1024, 1024])).set_output(True)
    piece = make_piece(static.final, 0, static.final.nodes)
    assert offer(piece, engine.configs(piece, H200, HeurMode.A)[0], H200) is None
    small = _hint_piece(_o_proj(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)))
    own = engine.configs(small, CPU, HeurMode.A)[0]
    assert offer(small, own, CPU) is None and engine.estimator(small, own, CPU) is None
    assert engine.configs_at(small, CPU, {"batch": 2, "seq": 17}) == []


def _config(name: str) -> EngineConfig:
    return EngineConfig("triton", (("template", "matmul"), ("BLOCK_M", len(name))))


def test_a_shape_runs_the_config_of_least_estimate_past_the_gain():
    own, a, b = _config("o"), _config("aa"), _config("bbb")
    costs = {own: 10.0, a: 7.0, b: 9.5}
    names = {own: "o", a: "a", b: "b"}
    assert GAIN == 0.9

    def est(c: EngineConfig):  # type: ignore[no-untyped-def]  (env: a config's estimate in percent)
        return lambda env: None if env.get("none") else costs[c] * env.get(names[c], 100) / 100

    choice = TileChoice((own, a, b), tuple(est(c) for c in (own, a, b)))
    assert choice.at({}) is a  # 7 <= 0.9 * 10, and least
    assert choice.at({"a": 200}) is None  # b's 9.5 is past the gain: the bucket's own
    assert choice.at({"a": 200, "b": 90}) is b  # 8.55 <= 9
    assert choice.at({"none": 1}) is None  # no estimate of its own: the bucket's
    assert choice.at({"a": 200}) is None and choice.at({}) is a  # (each shape's answer kept: the same again)
    smaller = choice.without(a)
    assert smaller is not None and smaller.configs == (own, b)
    assert smaller.without(b) is None


B, S = og.Dim("batch", 1, 16), og.Dim("seq", 1, 40)


def _linear() -> og.Graph:
    g = og.Graph("linear", io_data_type=og.DataType.FLOAT, compute_data_type=og.DataType.FLOAT)
    x = g.tensor(dim=[B, S, 16], name="x")
    g.relu(g.matmul(x, g.tensor(dim=[1, 16, 8], name="w"))).set_output(True).set_name("y")
    return g


@requires_interpreter
def test_a_shape_runs_its_tile_variant_compiled_with_the_bucket(monkeypatch):
    """The tiles given by hand (the CPU has no estimates): shapes of fewer than 24 rows run the variant,
    the others the bucket's own; each equals the reference engine; the variant's kernel is the bucket's
    (one module for its shapes), met before any shape ran it; describe() counts the steps."""
    offered: dict[int, TileChoice] = {}

    def fake_offer(piece, config, device, filters=None):  # type: ignore[no-untyped-def]
        if config.knob("template") != "matmul":
            return None
        others = get_engine("triton").configs(piece, device, HeurMode.B)
        variant = next(c for c in others if _tile(c) != _tile(config) and c.knob("SPLIT_K") in (None, 1))

        def rows(env: Mapping[str, int]) -> int:
            return env["batch"] * env["seq"]

        choice = TileChoice((config, variant), (lambda env: 10.0, lambda env: 1.0 if rows(env) < 24 else 20.0))
        offered[piece.index] = choice
        return choice

    monkeypatch.setattr(tile_variants, "offer", fake_offer)
    plan = _linear().build(device="cpu", engines=["triton"], buckets="one")
    assert offered, "the bucket's matmul step carries a variant"
    (index, choice) = next(iter(offered.items()))
    rng = np.random.default_rng(7)
    for b, s in [(1, 1), (3, 7), (16, 40), (2, 11), (5, 23), (1, 40)]:
        static = plan.graph.at({"batch": b, "seq": s})
        pack = random_pack(static, rng)
        want = reference_outputs(static, pack)
        plan.execute(pack)
        bad = [m for u in static.outputs if (m := compare(static.tensors[u], pack[u], want[u])) is not None]
        assert not bad, f"batch={b} seq={s}: {bad}"
        step = plan.at({"batch": b, "seq": s}).steps[index]
        assert step.config is (choice.variants[0] if b * s < 24 else choice.configs[0]), (b, s)
        assert step.kernel.repointed
    modules = {plan.at({"batch": b, "seq": s}).steps[index].kernel.module for b, s in [(1, 1), (3, 7), (2, 11)]}
    assert len(modules) == 1  # one kernel of the variant for the bucket
    assert plan.stats["retiles"] == 3 and plan.stats["shape_kernels"] == 0
    assert "tiles decided at each shape: 3 step(s)" in plan.describe()


def test_a_variant_that_fails_to_compile_is_dropped(monkeypatch):
    """A variant whose kernel fails to compile with the bucket's first shape comes back as the bucket's
    config (compile_steps' replacement): the step's choice loses it (the bucket's own tile, compiled beside
    it, stays)."""
    own, variant = _config("o"), _config("vv")
    planned = bucket_plan.BucketSchedule.__new__(bucket_plan.BucketSchedule)
    object.__setattr__(planned, "tiles", {4: TileChoice((own, variant), (lambda e: 1.0, lambda e: 0.1))})
    object.__setattr__(planned, "tiles_compiled", [False])

    class FakeStep:
        def __init__(self, index: int, config: EngineConfig) -> None:
            self.index, self.config, self.kernel = index, config, None

    main, extra = [FakeStep(0, own)], [FakeStep(4, variant), FakeStep(4, own)]
    compiled = [main[0], FakeStep(4, own), extra[1]]
    monkeypatch.setattr(bucket_plan, "compile_steps", lambda steps, dev, mode: (compiled, {}))
    stats: dict = {"retiled": []}
    kept, _ = bucket_plan._compile_with_variants(planned, main, extra, CPU, "parallel", stats)  # type: ignore[arg-type]
    assert kept == main and 4 not in planned.tiles and planned.tiles_compiled == [True]
    assert stats["variant_kernels"] == [None, None]


@pytest.mark.gpu
@requires_cuda
def test_gpu_small_shapes_of_a_wide_bucket_run_their_tile_variant():
    """On the GPU: a projection with the residual add over batch 2-16 x seq 17-256 (bf16). Its first shape
    compiles the bucket's kernel and its variant; 3 x 20 and 2 x 17 run the variant, 16 x 256 and 11 x 200
    the bucket's own, each equal to the reference engine; no shape after the first compiles anything."""
    batch, seq = og.Dim("batch", 2, 16), og.Dim("seq", 17, 256)
    g = og.Graph("o_proj_gpu", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    x, r = g.tensor(dim=[batch, seq, 1024], name="x"), g.tensor(dim=[batch, seq, 1024], name="r")
    w = g.tensor(dim=[1, 1024, 1024], stride=[1 << 20, 1, 1024], name="w")
    g.add(g.matmul(x, w), r).set_output(True).set_name("y")
    plan = g.build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(11)
    shapes = [(16, 256), (3, 20), (11, 200), (2, 17), (5, 31)]
    run_at_shape(plan, {"batch": shapes[0][0], "seq": shapes[0][1]}, rng)
    compiles = plan.stats["runtime_compiles"]
    for b, s in shapes[1:]:
        run_at_shape(plan, {"batch": b, "seq": s}, rng)
    tiles = [plan.at({"batch": b, "seq": s}).steps[0].config for b, s in shapes]
    own = tiles[0]
    assert tiles[2] is own and tiles[1] is not own and tiles[3] is tiles[1], [_tile(c) for c in tiles]
    assert plan.stats["retiles"] >= 2 and plan.stats["runtime_compiles"] == compiles
    assert plan.stats["shape_kernels"] == 0


@pytest.mark.gpu
@requires_cuda
def test_gpu_short_requests_of_a_down_projection_run_its_split_k_variant():
    """On the GPU: the down projection with the residual and the next RMSNorm's mean of squares over batch
    2-16 x seq 17-256 (bf16). 3 x 20 and 2 x 17 run a variant that splits K (its partials laid out for the
    bucket's largest shape), 16 x 256 the bucket's own; each equal to the reference engine; no shape after
    the first compiles anything."""
    g = _down_proj_rms(og.Dim("batch", 2, 16), og.Dim("seq", 17, 256))
    plan = g.build(device="cuda", engines=["triton"], buckets="one")
    rng = np.random.default_rng(12)
    shapes = [(16, 256), (3, 20), (11, 200), (2, 17)]
    # (relative to the output's scale: an element near zero is a sum of large products)
    run_at_shape(plan, {"batch": 16, "seq": 256}, rng, relative_to_scale=True)
    compiles = plan.stats["runtime_compiles"]
    for b, s in shapes[1:]:
        run_at_shape(plan, {"batch": b, "seq": s}, rng, relative_to_scale=True)
    configs = [
        next(st.config for st in plan.at({"batch": b, "seq": s}).steps if st.config.knob("template") == "matmul")
        for b, s in shapes
    ]
    splits = [c.knob("SPLIT_K") or 1 for c in configs]
    assert splits[0] == 1 and splits[1] > 1 and splits[3] > 1, configs
    assert plan.stats["runtime_compiles"] == compiles
    assert plan.stats["shape_kernels"] == 0
