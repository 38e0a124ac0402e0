"""The matmul template's Hopper path (TMA=1 TMA_HOST=1: host-side tensor descriptors as kernel arguments,
persistent, flattened, epilogue on column halves; templates/_matmul_hopper.py) and its launcher support
(engines/triton/tma_desc.py): the generated kernels against the reference engine under Triton's
interpreter (which takes TensorDescriptor arguments), the knobs, the candidates on a simulated H200, the
descriptor encoding and the native launcher's argument slots without a GPU; marked gpu, the real thing."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import opgraph as og
from opgraph.core.config import EngineConfig
from opgraph.core.device import Device
from opgraph.core.errors import AttributeValueError
from opgraph.core.piece import make_piece
from opgraph.engines.triton.knobs import TileKnobs

from ..helpers import plan_with, requires_cuda, step_plan
from .test_triton_matmul import mm_graph

pytestmark = pytest.mark.interpreter
DT = og.DataType
H200 = Device("cuda", 0, "NVIDIA H200", (9, 0), 132)
A100 = Device("cuda", 0, "NVIDIA A100", (8, 0), 108)
HOST = {"TMA": 1, "TMA_HOST": 1}


def _plan(g, knobs, **build):
    return plan_with(g, {**HOST, **knobs}, engines=("triton", "reference"), allow_partition=False, **build)


def _check(plan, rng, **kw):
    bad = og.testing.check_plan(plan, rng, **kw)
    assert not bad, "\n".join(map(str, bad))


def _bias_relu(dims_a, dims_b, dt, n, **layouts):
    g, _, _, c = mm_graph(dims_a, dims_b, dt=dt, **layouts)
    bias = g.tensor(dim=[1] * (len(dims_a) - 1) + [n], name="bias")
    g.relu(g.add(c, bias)).set_output(True)
    return g


def _matmul_template():
    from opgraph.engines.triton import TEMPLATES

    return next(t for t in TEMPLATES if t.name == "matmul")


# -- the generated kernels under the interpreter ----------------------------------------------------------------


@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16, DT.FLOAT], ids=lambda d: d.name)
@pytest.mark.parametrize("persistent,flatten,subtile", [(0, 0, 1), (3, 0, 2), (3, 1, 1), (3, 1, 2)])
def test_host_descriptors_bias_relu(dt, persistent, flatten, subtile, rng):
    """Ragged M, N, K (the descriptors' zero-filled edges), B column-major (an nn.Linear weight)."""
    g = _bias_relu((40, 40), (40, 72), dt, 72, b_layout="col")
    knobs = {
        "PERSISTENT": persistent,
        "FLATTEN": flatten,
        "EPILOGUE_SUBTILE": subtile,
        "BLOCK_M": 16,
        "BLOCK_N": 32,
        "BLOCK_K": 16,
    }
    plan = _plan(g, knobs)
    source = plan.source(0)
    assert "make_tensor_descriptor" not in source and "desc_A.load" in source and "desc_B.load" in source
    kinds = [a.kind for a in plan.steps[0].kernel.generated.launches[0].args]
    assert kinds.count("desc") == 3 and "tl.store" not in source  # A, B and the output's TMA stores
    if persistent and flatten:
        assert "work_c += 3" in source and "flatten=True" in source
    assert ("tl.split" in source) == (subtile == 2)
    _check(plan, rng)


@pytest.mark.parametrize("a_layout,b_layout", [("row", "row"), ("col", "col"), ("row", "gap"), ("col", "row")])
def test_layouts_batch_and_reduction(a_layout, b_layout, rng):
    """Batch axes (3-D descriptors, a broadcast B), every operand layout TMA reads, an epilogue with a
    row sum (whole tiles: 16 columns have no halves)."""
    g, _, _, c = mm_graph((3, 40, 40), (1, 40, 24), a_layout=a_layout, b_layout=b_layout)
    bias = g.tensor(dim=[1, 1, 24], name="bias")
    y = g.relu(g.add(c, bias)).set_output(True)
    g.reduction(y, mode="ADD").set_output(True).set_dim([3, 40, 1])
    plan = _plan(g, {"PERSISTENT": 3, "FLATTEN": 1, "EPILOGUE_SUBTILE": 2, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    assert plan.source(0).count("desc_") >= 2
    _check(plan, rng)


def test_residual_and_mean_of_squares_on_column_halves(rng):
    """A Llama block's output projection: the product plus the residual stream (stored through TMA, half
    by half) and RMSNorm's mean of squares of it, whose halves' partials add up before one store a tile."""
    g, _, _, c = mm_graph((40, 32), (32, 72), b_layout="col")
    residual = g.tensor(dim=[40, 72], name="residual")
    h = g.add(c, residual).set_output(True)
    g.reduction(g.mul(h, h), mode="AVG").set_output(True).set_dim([40, 1])
    plan = _plan(g, {"PERSISTENT": 3, "FLATTEN": 1, "EPILOGUE_SUBTILE": 2, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16})
    source = plan.source(0)
    assert source.count(f"desc_c{h.uid}.store(") == 2 and "rhalf" in source
    _check(plan, rng)


def test_outputs_stored_by_tma_where_they_allow(rng):
    """Two outputs: the product (row-major: a TMA store) and relu(product + bias) in a column-major layout
    (pointer stores); ragged edges, the epilogue on column halves."""
    g, _, _, c = mm_graph((40, 32), (32, 72))
    c.set_output(True)
    bias = g.tensor(dim=[1, 72], name="bias")
    y = g.relu(g.add(c, bias)).set_output(True)
    y.set_stride([1, 40])
    plan = _plan(g, {"PERSISTENT": 3, "FLATTEN": 1, "EPILOGUE_SUBTILE": 2, "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16})
    source = plan.source(0)
    assert source.count(f"desc_c{c.uid}.store(") == 2 and source.count("tl.store(") == 2
    _check(plan, rng)


def test_slice_view_offset_and_int8(rng):
    """An operand that is a slice of a larger buffer: the descriptor starts at the view's offset."""
    g = og.Graph("hopper_view", io_data_type=DT.INT8, intermediate_data_type=DT.FLOAT)
    big = g.tensor(dim=[2, 48, 64], name="A_big")
    b = g.tensor(dim=[2, 32, 16], name="B")
    a = g.slice(big, [slice(None), slice(8, 40), slice(16, 48)])
    g.matmul(a, b).set_output(True).set_data_type(DT.INT32)
    plan = _plan(g, {"PERSISTENT": 2, "FLATTEN": 1, "BLOCK_K": 32})
    (desc_a,) = [x for x in plan.steps[0].kernel.generated.launches[0].args if x.kind == "desc" and x.offset]
    assert desc_a.offset == 8 * 64 + 16 and desc_a.shape == (2, 32, 32)
    _check(plan, rng, rtol=0, atol=0)


def test_by_reference_operands_get_device_side_descriptors(rng):
    """A by-reference operand's (and output's) descriptor is made in the kernel from the address table
    (CUDA-graph double buffering: a table write redirects it); the other operand's stays a kernel argument."""
    g = og.Graph("hopper_ref", io_data_type=DT.HALF, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[40, 32], name="A", is_by_reference=True)
    b = g.tensor(dim=[32, 48], name="B")
    g.matmul(a, b).set_output(True).set_is_by_reference(True)
    plan = _plan(g, {"PERSISTENT": 3, "FLATTEN": 1, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    source = plan.source(0)
    assert "desc_A = tl.make_tensor_descriptor(tl.multiple_of(tl.load(og_table" in source
    assert source.count("tl.make_tensor_descriptor(") == 2 and ".store([pid_m * BLOCK_M" in source
    generated = plan.steps[0].kernel.generated
    assert [x.kind for x in generated.launches[0].args].count("desc") == 1 and "needs_allocator" in generated.notes
    _check(plan, rng)
    _check(plan, rng)  # new buffers, same plan


def test_split_k(rng):
    """SPLIT_K=2: the main kernel reads through host descriptors and writes partials; the epilogue launch
    stores by pointers."""
    g = _bias_relu((24, 96), (96, 40), DT.HALF, 40, b_layout="col")
    plan = _plan(g, {"SPLIT_K": 2, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    launches = plan.steps[0].kernel.generated.launches
    assert len(launches) == 2 and [a.kind for a in launches[0].args].count("desc") == 2
    assert not any(a.kind == "desc" for a in launches[1].args)
    _check(plan, rng)


def test_rebinding_a_moved_buffer(rng):
    """The interpreter's launcher makes descriptors again when a buffer moves (a new pack)."""
    g = _bias_relu((24, 32), (32, 40), DT.HALF, 40)
    plan = _plan(g, {"PERSISTENT": 2, "FLATTEN": 1, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16})
    for _ in range(2):
        _check(plan, rng)


# -- knobs and choice -----------------------------------------------------------------------------------------


def test_tma_host_knob_needs_tma():
    TileKnobs.parse({"BLOCK_M": 64, "BLOCK_N": 64, "TMA": 1, "TMA_HOST": 1})
    for bad in ({"TMA_HOST": 1}, {"TMA": 1, "TMA_HOST": 2}):
        with pytest.raises(AttributeValueError, match="TMA_HOST"):
            TileKnobs.parse({"BLOCK_M": 64, "BLOCK_N": 64, **bad})


def _piece(g):
    return make_piece(g.final, 0, g.final.nodes)


def _gpt2_mlp_up():
    g = _bias_relu((8192, 2048), (2048, 8192), DT.BFLOAT16, 8192, b_layout="col")
    return g


def test_h200_ranks_the_hopper_path_first():
    """Host descriptors, persistent over the SMs, flattened, 128x256 tiles with the epilogue on halves; the
    device-side configs follow (and the FLATTEN twin of the first of them)."""
    t = _matmul_template()
    cands = t.candidates(_piece(_gpt2_mlp_up()), H200)
    first = cands[0]
    assert first["TMA_HOST"] == 1 and first["TMA"] == 1 and first["FLATTEN"] == 1 and first["PERSISTENT"] == 132
    assert (first["BLOCK_M"], first["BLOCK_N"], first.get("EPILOGUE_SUBTILE")) == (128, 256, 2)
    device = [c for c in cands if c.get("TMA") and not c.get("TMA_HOST") and c.get("PERSISTENT")]
    assert device and {**device[0], "FLATTEN": 1} in cands
    ests = [t.estimate(_piece(_gpt2_mlp_up()), c, H200) for c in cands]
    assert ests[0] == min(ests)


def test_stages_fit_shared_memory_where_a_prologue_widens_the_staged_tiles():
    """B read as float32 and cast to bf16 in the prologue is staged as float32: every config's tiles fit
    an H200's shared memory (TMA keeps num_stages buffers, pointer loads one fewer), some by fewer stages
    than the same product of bf16 operands takes; for the CPU's interpreter they are left as they are."""
    from opgraph.engines.triton.gemm.tuning import SMEM_LIMIT

    def graph(cast):
        g = og.Graph("cast", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
        a = g.tensor(dim=[4096, 1024], name="A")
        w = g.tensor(dim=[1024, 4096], data_type=DT.FLOAT if cast else DT.BFLOAT16, name="W")
        b = g.identity(w).set_data_type(DT.BFLOAT16) if cast else w
        g.matmul(a, b).set_output(True)
        return g

    from opgraph.engines.triton.gemm.tuning import fit_shared_memory

    t = _matmul_template()
    for c in t.candidates(_piece(graph(True)), H200):
        staged = (c["BLOCK_M"] * 2 + c["BLOCK_N"] * 4) * c["BLOCK_K"] * (c["num_stages"] - (0 if c.get("TMA") else 1))
        assert staged <= SMEM_LIMIT or c["num_stages"] == 2, c
    wide = TileKnobs(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4, num_warps=8)
    cast, plain = (t.match(_piece(graph(c)), H200).gp for c in (True, False))
    assert [k.num_stages for k in fit_shared_memory([wide, wide.replace(TMA=1)], cast, H200)] == [3, 2]
    assert fit_shared_memory([wide, wide.replace(TMA=1)], plain, H200) == [wide, wide.replace(TMA=1)]
    assert fit_shared_memory([wide], cast, Device("cpu")) == [wide]


def test_no_hopper_path_before_sm90_nor_for_by_reference_operands():
    t = _matmul_template()
    assert not any(c.get("TMA_HOST") for c in t.candidates(_piece(_gpt2_mlp_up()), A100))
    g = og.Graph("ref", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[4096, 1024], name="A", is_by_reference=True)
    g.matmul(a, g.tensor(dim=[1024, 4096], name="B")).set_output(True)
    assert not any(c.get("TMA_HOST") for c in t.candidates(_piece(g), H200))


def test_signature_type_of_a_descriptor_parameter():
    from opgraph.engines.triton import TritonKernel
    from opgraph.engines.triton.templates.base import ArgKind

    g = _gpt2_mlp_up()
    piece = _piece(g)
    t = _matmul_template()
    first = t.candidates(piece, H200)[0]
    gen = t.generate(piece, first, H200)
    descs = [a for a in gen.launches[0].args if a.kind == ArgKind.DESC]
    assert [a.block for a in descs] == [(128, 128), (128, 64), (256, 64)]  # the output's stores on column halves
    assert [a.shape for a in descs] == [(8192, 8192), (8192, 2048), (8192, 2048)]
    assert [a.strides for a in descs] == [(8192, 1), (2048, 1), (2048, 1)]
    kernel = TritonKernel.__new__(TritonKernel)
    kernel.piece = piece
    assert [kernel._arg_type(a) for a in descs] == [
        "tensordesc<bf16[128, 128]>",
        "tensordesc<bf16[128, 64]>",
        "tensordesc<bf16[256, 64]>",
    ]


# -- descriptor encoding and the native launcher's slots, without a GPU -----------------------------------------


def test_encode_args_match_tritons_launcher():
    """cuTensorMapEncodeTiled's arguments as Triton's make_tensordesc_arg gives them: innermost axis first,
    byte strides without the innermost, the metadata's block, the host element type."""
    from opgraph.engines.triton import tma_desc
    from opgraph.engines.triton.templates.base import Arg, ArgKind

    arg = Arg(ArgKind.DESC, 3, 0, shape=(2, 8192, 1024), strides=(8192 * 1024, 1024, 1), block=(1, 128, 64))
    # bf16: Triton's element type 10 (what it compiles a bf16 descriptor to), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [1, 128, 64], "fp4_padded": False}
    kind, rank, address, dims, strides, box, ones, interleave, swizzle, l2, fill = tma_desc.encode_args(arg, 4096, meta)
    assert (kind, rank, address, interleave, swizzle, l2, fill) == (9, 3, 4096, 0, 3, 2, 0)
    assert tma_desc.encode_args(arg, 0, {**meta, "elem_type": 6})[0] == 6  # fp16: the same on both sides
    assert list(dims) == [1024, 8192, 2] and list(strides) == [2048, 2048 * 8192] and list(box) == [64, 128, 1]
    assert list(ones) == [1, 1, 1]
    assert tma_desc.rank_of("tensordesc<bf16[1, 128, 64]>") == 3 and tma_desc.rank_of("*bf16") == 0
    assert tma_desc.launchable([meta], 1) and not tma_desc.launchable(None, 1) and tma_desc.launchable(None, 0)
    assert not tma_desc.launchable([{**meta, "fp4_padded": True}], 1)


def test_a_descriptor_slot_re_encodes_a_moved_buffer_with_its_arrays_made_once():
    """A moved buffer re-encodes its descriptor at the new address (every bind of a backward plan's fresh
    activations): the slot passes the driver the same argument arrays with the new address; another
    argument or metadata makes them again."""
    from opgraph.engines.triton import tma_desc
    from opgraph.engines.triton.templates.base import Arg, ArgKind

    arg = Arg(ArgKind.DESC, 3, 0, shape=(8192, 1024), strides=(1024, 1), block=(128, 64))
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [128, 64]}
    calls = []

    def fn(address, *args):
        calls.append(args)
        return 0

    slot = tma_desc.TensorMapSlot()
    assert not slot.holds(arg)
    slot.encode(fn, lambda rc, what: None, arg, 4096, meta)
    slot.encode(fn, lambda rc, what: None, arg, 8192, meta)
    assert slot.holds(arg)
    (k1, r1, a1, *rest1), (k2, r2, a2, *rest2) = calls
    assert (a1, a2) == (4096, 8192) and (k1, r1) == (k2, r2) == (9, 2)
    assert all(x is y for x, y in zip(rest1[:4], rest2[:4]))  # dims, strides, box, ones: made once
    assert [list(x) for x in rest2[:4]] == [[1024, 8192], [2048], [64, 128], [1, 1]]
    other = Arg(ArgKind.DESC, 4, 0, shape=(512, 1024), strides=(1024, 1), block=(128, 64))
    slot.encode(fn, lambda rc, what: None, other, 4096, meta)
    assert list(calls[-1][3]) == [1024, 512] and slot.holds(other) and not slot.holds(arg)


def test_tma_strides_of_unit_axes_are_aligned():
    from opgraph.engines.triton.gemm import tma_strides

    assert tma_strides([1, 8], [3, 1], 2) == [8, 1]  # a size-1 axis: any aligned stride
    assert tma_strides([4, 1, 64], [64, 5, 1], 4) == [64, 64, 1]


def test_native_slots_of_a_descriptor(monkeypatch):
    """A descriptor parameter is a 64-byte aligned 128-byte map, then rank i32 dims, then rank i64 strides;
    set_descriptor encodes into the map (a stand-in cuTensorMapEncodeTiled here) and fills the rest."""
    from opgraph.engines.triton import native
    from opgraph.engines.triton.templates.base import Arg, ArgKind

    calls = []

    class FakeDriver:
        launch = None

        def encode(self):
            def fn(address, *args):
                calls.append((address, args))
                ctypes.memset(address, 7, 128)
                return 0

            return fn

        def check(self, rc, what):
            assert rc == 0, what

    monkeypatch.setattr(native, "_DRIVER", FakeDriver())
    types = ["*bf16", "tensordesc<bf16[128, 64]>", "fp32"]
    launch = native.NativeLaunch(1, (132, 1, 1), 8, 1024, types, ctypes.c_void_p(0))
    assert launch.index == (0, 1, 6) and len(launch.words) == 7 + 2
    tensor_map = launch.maps[1]
    assert tensor_map.address % 64 == 0 and launch.params[1] == tensor_map.address
    arg = Arg(ArgKind.DESC, 5, 0, shape=(8192, 1024), strides=(1024, 1), block=(128, 64))
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [128, 64]}
    launch.set_descriptor(1, arg, 1 << 20, meta)
    assert calls[0][0] == tensor_map.address and calls[0][1][2] == 1 << 20
    assert tensor_map.raw() == bytes([7]) * 128
    # every parameter's address holds its value: the dims as int32, the strides as int64
    assert [ctypes.c_int32.from_address(launch.params[k]).value for k in (2, 3)] == [8192, 1024]
    assert [ctypes.c_int64.from_address(launch.params[k]).value for k in (4, 5)] == [1024, 1]
    launch.set(0, 1 << 21)
    launch.set(2, 0.5)
    assert ctypes.c_uint64.from_address(launch.params[0]).value == 1 << 21
    assert ctypes.c_float.from_address(launch.params[6]).value == 0.5
    launch.set(2, -3.25)
    assert ctypes.c_float.from_address(launch.params[6]).value == -3.25


def test_native_launch_scalar_slots_read_as_their_types(monkeypatch):
    """Each scalar parameter's slot, read at its address as its parameter type, holds what was set:
    negative int32, int64 and float64 values included; the scratch pointers follow the arguments."""
    from opgraph.engines.triton import native

    monkeypatch.setattr(native, "_DRIVER", type("FakeDriver", (), {"launch": None})())

    types = ["*fp32", "i32", "i64", "fp64", "fp16", "bf16", "i1"]
    launch = native.NativeLaunch(1, (4, 2, 1), 4, 0, types, ctypes.c_void_p(0), global_scratch=1 << 30)
    values = [1 << 40, -7, -(1 << 40), -2.5, 1.5, 2.0, 1]
    for i, v in enumerate(values):
        launch.set(i, v)
    at = launch.params
    assert ctypes.c_uint64.from_address(at[0]).value == 1 << 40
    assert ctypes.c_int32.from_address(at[1]).value == -7
    assert ctypes.c_int64.from_address(at[2]).value == -(1 << 40)
    assert ctypes.c_double.from_address(at[3]).value == -2.5
    assert ctypes.c_uint16.from_address(at[4]).value == 0x3E00  # 1.5 in fp16
    assert ctypes.c_uint16.from_address(at[5]).value == 0x4000  # 2.0 in bf16
    assert ctypes.c_int8.from_address(at[6]).value == 1
    assert len(launch.words) == len(types) + 2 and ctypes.c_uint64.from_address(at[7]).value == 1 << 30
    assert launch.args[1:4] == (4, 2, 1) and launch.args[4] == 128
    float_launch = native.NativeLaunch(1, (1, 1, 1), 4, 0, ["fp32"], ctypes.c_void_p(0))
    float_launch.set(0, 1e39)  # beyond float32: inf, as a C cast makes it
    assert ctypes.c_float.from_address(float_launch.params[0]).value == float("inf")


# -- Hopper compilation (Triton's NVIDIA backend, no GPU) and the GPU -------------------------------------------


def _hopper_piece_graph():
    """GPT-2's MLP up-projection at a reduced size: bf16, B as an nn.Linear weight, + bias, GELU."""
    g, _, _, c = mm_graph((1024, 768), (768, 3072), dt=DT.BFLOAT16, b_layout="col")
    bias = g.tensor(dim=[1, 3072], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    return g


def _square_fp16():
    g, _, _, c = mm_graph((2048, 2048), (2048, 2048), dt=DT.HALF, b_layout="col")
    c.set_output(True)
    return g


def _host(cands):
    return [c for c in cands if c.get("TMA_HOST")][:1]


def _occupancy(cands):
    """The two-programs-a-multiprocessor candidate of a math-heavy epilogue (_matmul_hopper.occupancy_config)."""
    return [c for c in cands if c.get("PERSISTENT", 0) > 132]


HOPPER_CASES = {
    "mlp_up_host": (_hopper_piece_graph, "matmul", _host),
    "square_fp16": (_square_fp16, "matmul", _host),
    "mlp_up_occupancy": (_hopper_piece_graph, "matmul", _occupancy),
}


def test_kernels_compile_for_hopper():
    """The Hopper path's kernel compiles for sm_90 with no spills (the descriptors' parameters typed as the
    engine types them); the occupancy candidate in at most 128 registers a thread and 113 KB of shared
    memory a program: two programs of 256 threads fit a multiprocessor."""
    from .hopper_compile import compile_for_hopper

    lines = [line for line in compile_for_hopper(__name__).splitlines() if line.startswith("compiled")]
    assert len(lines) == 3 and all("'TMA_HOST': 1" in line for line in lines), lines
    for line in lines:
        fields = line.split()
        assert fields[6] == "0", lines  # no spills
        # the operands' TMA loads and the output's TMA stores (cp.async.bulk.tensor), no pointer stores
        assert int(fields[fields.index("tma") + 1]) >= 3 and fields[fields.index("st.v4") + 1] == "0", lines
        if fields[1] == "mlp_up_occupancy":
            assert int(fields[4]) <= 128 and int(fields[fields.index("smem") + 1]) <= 113 * 1024, line


def test_a_math_heavy_epilogue_offers_two_programs_a_multiprocessor_for_tuning():
    """On an H200 the erf GELU's projection offers the occupancy config (last but the fallback: for tuning;
    the heuristic's first stays the 128x256 host-descriptor config); a bias alone does not."""
    t = _matmul_template()
    cands = t.candidates(_piece(_hopper_piece_graph()), H200)
    (occ,) = _occupancy(cands)
    assert cands.index(occ) == len(cands) - 2 and cands[0]["BLOCK_N"] == 256
    assert (occ["BLOCK_M"], occ["BLOCK_N"], occ["num_warps"], occ["num_stages"]) == (128, 128, 8, 2)
    assert occ["PERSISTENT"] == 2 * H200.sm_count and occ["TMA_HOST"] == 1
    g, _, _, c = mm_graph((1024, 768), (768, 3072), dt=DT.BFLOAT16, b_layout="col")
    g.add(c, g.tensor(dim=[1, 3072], name="bias")).set_output(True)
    assert not _occupancy(t.candidates(_piece(g), H200))


def test_the_hopper_path_of_a_split_k_config_is_unsplit():
    """hopper_config (and occupancy_config, which scripts/hopper_gemm_check.py --occupancy applies to the
    heuristic's choice of every row) of a split-K config: FLATTEN wants SPLIT_K 1 (the script's row of
    a split-K choice raised AttributeValueError on the GPU)."""
    from opgraph.engines.triton.knobs import TileKnobs
    from opgraph.engines.triton.templates._matmul_hopper import hopper_config, occupancy_config

    split = TileKnobs(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, SPLIT_K=4, num_warps=4, num_stages=3)
    for k in (hopper_config(split, H200), occupancy_config(split, H200)):
        assert (k.SPLIT_K, k.FLATTEN, k.TMA_HOST) == (1, 1, 1) and k.PERSISTENT


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dt", [DT.HALF, DT.BFLOAT16], ids=lambda d: d.name)
def test_gpu_hopper_path_matches(dt, rng):
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs compute capability 9.0")
    g, _, _, c = mm_graph((1000, 1024), (1024, 1000 + 24), dt=dt, b_layout="col")
    bias = g.tensor(dim=[1, 1024], name="bias")
    g.gelu(g.add(c, bias)).set_output(True)
    plan = g.build(device="cuda", engines=["triton"])
    assert plan.steps[0].config.knob("TMA_HOST") == 1, plan.describe()
    for _ in range(2):  # new buffers: the descriptors encoded again
        _check(plan, rng)


@pytest.mark.gpu
@requires_cuda
def test_gpu_by_reference_and_graph_replay(rng):
    import torch

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs compute capability 9.0")
    g = og.Graph("hopper_ref_gpu", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    a = g.tensor(dim=[512, 256], name="A", is_by_reference=True)
    b = g.tensor(dim=[256, 512], name="B")
    y = g.matmul(a, b).set_output(True)
    built = g.build(device="cuda", engines=["triton"])
    knobs = {
        **dict(built.steps[0].config.knobs),
        **HOST,
        "PERSISTENT": 132,
        "FLATTEN": 1,
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 64,
        "SPLIT_K": 1,
        "num_warps": 8,
        "num_stages": 3,
    }
    plan = step_plan(built, built.steps[0], EngineConfig("triton", tuple(sorted(knobs.items()))))
    assert "tl.make_tensor_descriptor(tl.multiple_of(tl.load(og_table" in plan.source(0)
    xs = [torch.randn(512, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    bv = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(512, 512, device="cuda", dtype=torch.bfloat16)
    for _ in range(4):
        for x in xs:  # double buffering: the table moves A every execute
            out.fill_(float("nan"))
            plan.execute({a: x, b: bv, y: out})
            np.testing.assert_allclose(
                out.float().cpu().numpy(), (x.float() @ bv.float()).cpu().numpy(), rtol=2e-2, atol=2e-1
            )


def test_an_unaligned_buffer_is_a_typed_error():
    import torch

    from opgraph.core.errors import ExecutionError
    from opgraph.engines.triton import tma_desc
    from opgraph.engines.triton.templates.base import Arg, ArgKind

    buffer = torch.zeros(64, dtype=torch.float16)
    arg = Arg(ArgKind.DESC, 0, 1, shape=(7, 8), strides=(8, 1), block=(16, 16))
    with pytest.raises(ExecutionError, match="16-byte"):
        tma_desc.descriptor_object(arg, buffer)
    assert (
        tma_desc.descriptor_object(
            Arg(ArgKind.DESC, 0, 8, shape=(7, 8), strides=(8, 1), block=(16, 16)), buffer
        ).base.data_ptr()
        == buffer.data_ptr() + 16
    )


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("rank", [2, 3])
def test_gpu_encoding_equals_tritons(rank):
    """The native launcher's CUtensorMap is byte for byte the one Triton's launcher encodes for the same
    descriptor (its fill_tma_descriptor(_tiled); the map sits at the end of its PyCUtensorMap object)."""
    import torch
    import triton

    from opgraph.engines.triton import native, tma_desc
    from opgraph.engines.triton.templates.base import Arg, ArgKind

    shape = (3, 256, 1024)[3 - rank :]
    x = torch.empty(*shape, dtype=torch.bfloat16, device="cuda")
    strides = tuple(x.stride())
    block = (1, 128, 64)[3 - rank :]
    arg = Arg(ArgKind.DESC, 0, 0, shape=shape, strides=strides, block=block)
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": list(block)}
    slot = tma_desc.TensorMapSlot()
    d = native.driver()
    slot.encode(d.encode(), d.check, arg, x.data_ptr(), meta)
    utils = triton.runtime.driver.active.utils
    fill = getattr(utils, "fill_tma_descriptor_tiled", None) or utils.fill_tma_descriptor
    theirs = fill(x.data_ptr(), 3, 2, 9, list(block), list(shape), list(strides), 0)
    at = id(theirs) + type(theirs).__basicsize__ - tma_desc.MAP_BYTES
    assert slot.raw() == ctypes.string_at(at, tma_desc.MAP_BYTES)


def test_a_row_reduction_epilogue_takes_tiles_that_fit():
    """A product whose epilogue ends in a row reduction (the residual add and the next RMSNorm's mean of
    squares after a Llama down projection) exchanges its float32 (sub)tile through shared memory: the
    first config is 128 x 256 on column halves, and every config's staged tiles plus that tile (a column
    half of it under EPILOGUE_SUBTILE=2) fit (ptxas on sm_90: 128 x 256 at 3 stages, whole tiles, asked
    278,552 bytes; on halves 213,016; bench/results/triton-preferences.md#row-reduction-tiles)."""
    from opgraph.engines.triton.gemm.tuning import SMEM_LIMIT, reduction_tile_bytes

    g = og.Graph("down", io_data_type=DT.BFLOAT16, intermediate_data_type=DT.FLOAT)
    h = g.matmul(g.tensor(dim=[1, 8192, 2816], name="A"), g.tensor(dim=[1, 2816, 1024], name="W"))
    h = g.add(h, g.tensor(dim=[1, 8192, 1024], name="res")).set_output(True).set_data_type(DT.BFLOAT16)
    g.reduction(g.mul(h, h), "AVG").set_dim([1, 8192, 1]).set_output(True)
    t = _matmul_template()
    m = t.match(_piece(g), H200)
    # (the warp-specialized Gluon kernel, first for a product reading a residual, sums its rows by warp shuffles:
    # test_triton_matmul_ws.py)
    cands = [c for c in t.candidates(_piece(g), H200) if not c.get("WS")]
    first = cands[0]
    assert (first["BLOCK_M"], first["BLOCK_N"], first.get("EPILOGUE_SUBTILE"), first.get("TMA_HOST")) == (
        128,
        256,
        2,
        1,
    )
    for c in cands[:-1]:
        k = TileKnobs(**c)
        staged = (c["BLOCK_M"] + c["BLOCK_N"]) * 2 * c["BLOCK_K"] * (c["num_stages"] - (0 if c.get("TMA") else 1))
        assert reduction_tile_bytes(k, m.gp) == c["BLOCK_M"] * c["BLOCK_N"] * 4 // (c.get("EPILOGUE_SUBTILE") or 1)
        assert staged + reduction_tile_bytes(k, m.gp) <= SMEM_LIMIT or c["num_stages"] == 2, c
    plain = _piece(_hopper_piece_graph())
    assert reduction_tile_bytes(TileKnobs(BLOCK_M=128, BLOCK_N=256), t.match(plain, H200).gp) == 0


def test_a_config_too_large_at_two_stages_is_left_out_but_the_last():
    from opgraph.engines.triton.gemm.tuning import fit_shared_memory

    gp = _matmul_template().match(_piece(_hopper_piece_graph()), H200).gp
    huge = TileKnobs(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, num_stages=3, num_warps=8, TMA=1)
    small = TileKnobs(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=3, num_warps=8)
    assert fit_shared_memory([huge, small], gp, H200) == [small]
    assert fit_shared_memory([small, huge], gp, H200) == [small, huge.replace(num_stages=2)]
