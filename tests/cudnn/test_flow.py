"""opgraph.cudnn's pygraph flow, entry point by entry point: tensors, validation adaptations, plan
candidates and plan-index functions, filters, execute and its variant packs, files, errors."""

from __future__ import annotations

import json

import pytest

import opgraph as og
from opgraph import cudnn
from opgraph.testing import compare, reference_outputs

torch = pytest.importorskip("torch")


@pytest.fixture
def handle():
    return cudnn.create_handle("cpu")


def _conv_bias_relu(handle, n=2, c=4, k=6, hw=6):
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FLOAT,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
    )
    x = torch.randn(n, c, hw, hw).to(memory_format=torch.channels_last)
    w = torch.randn(k, c, 3, 3).to(memory_format=torch.channels_last)
    b = torch.randn(1, k, 1, 1)
    X = g.tensor(name="X", dim=x.size(), stride=x.stride(), data_type=x.dtype)
    W = g.tensor(name="W", dim=w.size(), stride=w.stride(), data_type=w.dtype)
    B = g.tensor_like(b, name="B")
    Y = g.relu(input=g.bias(input=g.conv_fprop(image=X, weight=W, padding=[1, 1]), bias=B), name="relu")
    Y.set_output(True)
    want = torch.relu(torch.nn.functional.conv2d(x.double(), w.double(), b.double().reshape(-1), padding=1))
    return g, (X, W, B, Y), (x, w, b), want


def _built(g):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def _out(want):
    return torch.full(want.shape, float("nan"), dtype=torch.float32).to(memory_format=torch.channels_last)


def test_flow_executes_against_pytorch(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    _built(g)
    y = _out(want)
    g.execute({X: x, W: w, B: b, Y: y}, torch.empty(g.get_workspace_size(), dtype=torch.uint8), handle=handle)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_plan_index_functions(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    g.validate()
    assert g.get_execution_plan_count() == 0
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="create_execution_plans"):
        g.check_support()
    g.create_execution_plans([cudnn.heur_mode.A])
    count = g.get_execution_plan_count()
    assert count >= 1 and g.get_plan_name_at_index(0) == "reference"
    assert g.get_workspace_size_plan_at_index(0) == 0  # not built yet: 0, as cuDNN answers
    assert cudnn.behavior_note.HOST_EXECUTION in g.get_behavior_notes_for_plan_at_index(0)
    assert cudnn.numerical_note.FP64_ACCUMULATION in g.get_numerical_notes_for_plan_at_index(0)
    engine, knobs = g.get_engine_and_knobs_at_index(0)
    assert engine == 0 and knobs == {cudnn.knob_type.KERNEL_CFG: 0}
    with pytest.raises(og.AttributeValueError, match="there is no plan 5"):
        g.build_plan_at_index(5)
    g.build_plan_at_index(0)
    y = _out(want)
    g.execute_plan_at_index({X: x, W: w, B: b, Y: y}, None, 0, handle=handle)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
    assert g.get_behavior_notes() == g.get_behavior_notes_for_plan_at_index(0)


def test_engines_and_knobs(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    g.build_operation_graph()
    assert g.get_engine_count() == 1  # the reference engine on the CPU
    (knob,) = g.get_knobs_for_engine(0)
    assert knob.type is cudnn.knob_type.KERNEL_CFG and (knob.min_value, knob.max_value, knob.stride) == (0, 0, 1)
    with pytest.raises(RuntimeError, match="there is no engine 3"):
        g.get_knobs_for_engine(3)
    with pytest.raises(RuntimeError, match="kernel configs 0..0, not 4"):
        g.create_execution_plan(0, {cudnn.knob_type.KERNEL_CFG: 4})
    with pytest.raises(RuntimeError, match="SPLIT_K_BUF"):
        g.create_execution_plan(0, {cudnn.knob_type.SPLIT_K_BUF: 1})
    g.create_execution_plan(0, {cudnn.knob_type.KERNEL_CFG: 0})
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    y = _out(want)
    g.execute({X: x, W: w, B: b, Y: y}, None)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_filters(handle):
    g, *_ = _conv_bias_relu(handle)
    g.deselect_engines(["reference"])
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="engine reference deselected") as ei:
        g.create_execution_plans([cudnn.heur_mode.A])
    assert isinstance(ei.value, og.UnsupportedGraphError) and ei.value.rule == "engine.no_config"
    g.deselect_engines([])
    g.deselect_numeric_notes([cudnn.numerical_note.WINOGRAD])  # no opgraph config has it: nothing to drop
    g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])
    g.deselect_workspace_greater_than(0)
    g.create_execution_plans([cudnn.heur_mode.A])
    g.select_behavior_notes([cudnn.behavior_note.SUPPORTS_CUDA_GRAPH_NATIVE_API])
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="lacks selected note"):
        g.create_execution_plans([cudnn.heur_mode.A])
    with pytest.raises(og.AttributeValueError, match="no opgraph engine config has"):
        g.select_numeric_notes([cudnn.numerical_note.FFT])


def test_build_shorthands(handle):
    g, (X, _, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    g.build()  # validate + operation graph only
    assert g.get_execution_plan_count() == 0
    g.build([cudnn.heur_mode.A])
    y = _out(want)
    g.execute({X.get_uid(): x, "W": w, B: b, Y: y}, None)  # UID, name and handle keys
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


def test_execute_before_build_and_shape_overrides_are_refused(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    g.validate()
    with pytest.raises(RuntimeError, match="no execution plan is built") as ei:
        g.execute({X: x}, None)
    assert ei.value.rule == "cudnn.not_built"
    _built(g)
    with pytest.raises(RuntimeError, match="shape overrides"):
        g.execute({X: x, W: w, B: b, Y: _out(want)}, None, override_uids=[1], override_shapes=[[1]])


def test_variant_pack_loose_entries(handle):
    """None keys and values are skipped, unused declared tensors are dropped, a dense buffer of another
    shape binds by address, a CPU torch workspace is accepted, a raw host address is refused."""
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    x = torch.randn(3, 5, 7)
    X = g.tensor_like(x)
    unused = g.tensor(dim=[4], stride=[1], name="unused")
    S = g.reduction(input=X, mode=cudnn.reduction_mode.ADD)
    S.set_output(True).set_dim([3, 1, 7]).set_data_type(cudnn.data_type.FLOAT)
    g.build([cudnn.heur_mode.A])
    s = torch.full((3, 7), float("nan"))  # [3, 7] for a [3, 1, 7] tensor: the same memory, cuDNN-style
    g.execute(
        {X: x, S: s, unused: torch.zeros(4), None: torch.zeros(2), "nothing": None},
        torch.empty(8, dtype=torch.uint8),
        handle=handle,
    )
    torch.testing.assert_close(s.double(), x.double().sum(1), rtol=1e-5, atol=1e-5)
    with pytest.raises(og.VariantPackError, match="int is not a buffer") as ei:
        g.execute({X: x.data_ptr(), S: s}, None)
    assert isinstance(ei.value, RuntimeError) and ei.value.tensor.startswith("tensor")
    g.execute({X: x, S: s}, 12345)  # a raw host workspace address is not used: the plan has its own


def test_cudnn_stride_inference_for_pointwise_outputs(handle):
    """q[..., :4] * 2 written back over q[..., :4]: the output takes the view's gapped strides."""
    q = torch.randn(3, 5, 16)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    Q = g.tensor_like(q[..., :4])
    Y = g.mul(a=Q, b=2.0)
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    assert Y.get_stride() == [80, 16, 1]
    want = q.clone()
    want[..., :4] *= 2
    g.execute({Q: q[..., :4], Y: q[..., :4]}, None)  # in place through the pack
    torch.testing.assert_close(q, want)


def test_serialize_round_trip(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    _built(g)
    data = g.serialize()
    assert isinstance(data, list) and all(isinstance(v, int) for v in data[:8])
    for form in (data, bytes(data), bytes(data).decode()):
        loaded = cudnn.pygraph()
        loaded.deserialize(handle, form)
        assert loaded.get_execution_plan_count() == 1
        y = _out(want)
        loaded.execute(
            {X.get_uid(): x, W.get_uid(): w, B.get_uid(): b, Y.get_uid(): y},
            torch.empty(loaded.get_workspace_size(), dtype=torch.uint8),
            handle=handle,
        )
        torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
        attrs = loaded.query_tensor_attributes_of_uid(Y.get_uid())
        assert attrs.get_dim() == list(want.shape) and attrs.get_data_type() is cudnn.data_type.FLOAT
        assert not attrs.get_is_virtual() and not attrs.get_is_pass_by_value() and attrs.get_name() == "relu::output"
    with pytest.raises(og.SerializationError) as ei:
        cudnn.pygraph().deserialize(b"not a plan")
    assert isinstance(ei.value, RuntimeError)
    with pytest.raises(RuntimeError, match="UID 999"):
        loaded.query_tensor_attributes_of_uid(999)


def test_key_and_repr(handle):
    g1, *_ = _conv_bias_relu(handle)
    g2, *_ = _conv_bias_relu(handle)
    assert g1.key() == g2.key() and isinstance(g1.key(), int)
    text = repr(g1)
    assert json.loads(text)["name"] == "test_graph" and "relu" in text
    bad = cudnn.pygraph()
    bad.tensor(dim=[2], stride=[1], name="lonely")
    assert "invalid" in json.loads(repr(bad))


def test_tensor_arguments_in_cudnn_order(handle):
    g = cudnn.pygraph(handle=handle)
    t = g.tensor([2, 3], [3, 1], cudnn.data_type.FLOAT, False, False, None, cudnn.tensor_reordering.NONE, "t", 42)
    assert (t.get_name(), t.get_uid(), t.get_data_type(), t.get_is_virtual()) == ("t", 42, og.DataType.FLOAT, False)
    assert g.tensor(dim=[2], stride=[1], uid=-1).get_uid() is None  # -1: assigned at validate
    packed = g.tensor(dim=[2], stride=[1], ragged_offset=t)  # cuDNN's ragged tensors (attention ops read them)
    assert packed.get_ragged_offset() is t and t.get_ragged_offset() is None
    with pytest.raises(og.AttributeValueError, match="ragged") as ei:
        g.tensor(dim=[2], stride=[1], ragged_offset=t, ragged_offset_multiplier=2)
    assert isinstance(ei.value, RuntimeError)
    with pytest.raises(RuntimeError, match="reordering"):
        g.tensor(dim=[2], stride=[1], reordering_type=cudnn.tensor_reordering.INT8x32)
    with pytest.raises(og.DataTypeError, match="not supported by opgraph"):
        g.tensor(dim=[2], stride=[1], data_type=cudnn.data_type.INT4)


def test_tensor_like_and_scalars(handle):
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, handle=handle)
    a = torch.randn(2, 3, 4)
    A = g.tensor_like(a)
    assert (A.get_dim(), A.get_stride(), A.get_data_type()) == ([2, 3, 4], [12, 4, 1], og.DataType.FLOAT)
    one = g.tensor_like(torch.full((1, 1, 1), 3.0))  # a CPU scalar: pass-by-value, as cuDNN
    assert one.get_is_pass_by_value()
    b1 = g.tensor_like(torch.full((1, 1, 4), 0.5))  # not one element: an ordinary tensor
    half = g.tensor_scalar(0.5, cudnn.scalar_type.RUNTIME_PARAM)  # bound by the shim at execute
    two = g.tensor_scalar(2.0)  # compile-time: the number itself
    mat = g.tensor_like(torch.full((1, 1, 1), 2.0))  # read as a matmul operand: ordinary after all
    Y = g.add(a=g.mul(a=g.mul(a=g.mul(a=A, b=one), b=half), b=b1), b=two)
    a2 = torch.randn(2, 3, 1)
    A2 = g.tensor_like(a2)
    Z = g.matmul(A=A2, B=mat)
    Y.set_output(True)
    Z.set_output(True).set_dim([2, 3, 1])
    g.build([cudnn.heur_mode.A])
    assert one.get_is_pass_by_value() and not mat.get_is_pass_by_value()
    y, z = torch.empty(2, 3, 4), torch.empty(2, 3, 1)
    g.execute(
        {
            A: a,
            A2: a2,
            one: torch.full((1, 1, 1), 3.0),
            b1: torch.full((1, 1, 4), 0.5),
            mat: torch.full((1, 1, 1), 2.0),
            Y: y,
            Z: z,
        },
        None,
    )
    torch.testing.assert_close(y, a * 0.75 + 2)
    torch.testing.assert_close(z, a2 * 2)
    h = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT)
    copy = h.tensor_like(Z, name="Zc")  # a tensor of another (validated) graph
    assert (copy.get_dim(), copy.get_name()) == ([2, 3, 1], "Zc")
    assert h.tensor_like(1.5).get_is_pass_by_value()
    with pytest.raises(RuntimeError, match="no dims"):
        other = cudnn.pygraph()
        h.tensor_like(other.relu(input=other.tensor(dim=[2], stride=[1])))  # not validated: dims unknown


def test_pygraph_options(handle):
    g = cudnn.pygraph(handle=handle, sm_count=132, kernel_cache=None, is_cuda_graph_replay_expected=True)
    assert (g.name, g.io_data_type, g.compute_data_type) == ("test_graph", og.DataType.HALF, og.DataType.FLOAT)
    with pytest.raises(TypeError, match="no_such_option"):
        cudnn.pygraph(no_such_option=1)


def test_builder_errors_are_runtime_errors(handle):
    g = cudnn.pygraph(handle=handle)
    with pytest.raises(og.ShapeError) as ei:
        g.conv_fprop(image=[1, 2], weight=g.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1]))
    assert isinstance(ei.value, RuntimeError) and ei.value.rule == "op.operand"
    x = g.tensor(dim=[2, 4, 5, 5], stride=[100, 25, 5, 1])
    g.conv_fprop(image=x, weight=g.tensor(dim=[3, 2, 3, 3], stride=[18, 9, 3, 1])).set_output(True)
    with pytest.raises(og.ShapeError, match="channels") as ei:
        g.validate()
    assert isinstance(ei.value, RuntimeError) and "What to do" in str(ei.value)


def test_cuda_graph_calls_need_a_gpu_plan(handle):
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    _built(g)
    pack = {X: x, W: w, B: b, Y: _out(want)}
    with pytest.raises(RuntimeError, match="CUDA graphs need a plan built for a CUDA device"):
        g.populate_cuda_graph(handle, pack, None)
    with pytest.raises(og.AttributeValueError, match="cudaGraph_t"):
        g.populate_cuda_graph(handle, pack, None, 1234)


def test_reference_engine_agrees_through_the_shim(handle, rng):
    """The shim's plan and a plain opgraph reference run of the same FinalGraph give the same bits."""
    g, (X, W, B, Y), (x, w, b), want = _conv_bias_relu(handle)
    _built(g)
    y = _out(want)
    g.execute({X: x, W: w, B: b, Y: y}, None)
    f = g.final
    ref = reference_outputs(f, {X.get_uid(): x.numpy(), W.get_uid(): w.numpy(), B.get_uid(): b.numpy()})
    assert compare(f.tensors[Y.get_uid()], y.numpy(), ref[Y.get_uid()], rtol=0, atol=0) is None


def _nchw_for_nhwc(handle, **options):
    """X declared NHWC (channels-last strides); the program binds NCHW data of the same dims."""
    g = cudnn.pygraph(
        io_data_type=cudnn.data_type.FLOAT,
        intermediate_data_type=cudnn.data_type.FLOAT,
        compute_data_type=cudnn.data_type.FLOAT,
        handle=handle,
        **options,
    )
    x = torch.randn(2, 4, 5, 5)  # NCHW
    w = torch.randn(6, 4, 3, 3).to(memory_format=torch.channels_last)
    X = g.tensor(name="X", dim=[2, 4, 5, 5], stride=[100, 1, 20, 4], data_type=x.dtype)
    W = g.tensor(name="W", dim=w.size(), stride=w.stride(), data_type=w.dtype)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], name="conv")
    Y.set_output(True)
    g.build([cudnn.heur_mode.A])
    y = torch.full((2, 6, 5, 5), float("nan")).to(memory_format=torch.channels_last)
    return g, (X, W, Y), (x, w, y)


def test_a_buffer_whose_strides_contradict_the_tensor_is_refused(handle):
    """cuDNN sees a pointer only and would read NCHW data with the NHWC strides (outputs off by 22 in
    issue 38); opgraph sees the tensor's layout and raises the pack's own error."""
    g, (X, W, Y), (x, w, y) = _nchw_for_nhwc(handle)
    with pytest.raises(og.VariantPackError) as ei:
        g.execute({X: x, W: w, Y: y}, None, handle=handle)
    err = ei.value
    assert isinstance(err, RuntimeError)  # cuDNN programs catch RuntimeError
    assert err.rule == "pack.strides" and "[rule pack.strides]" in str(err) and "'X'" in str(err)
    assert torch.isnan(y).all()  # nothing ran
    # the layout the tensor declares binds, and so does [N, H, W]-style data with size-1 axes dropped
    g.execute({X: x.to(memory_format=torch.channels_last), W: w, Y: y}, None, handle=handle)
    want = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("how", ["argument", "module"])
def test_check_strides_can_be_turned_off_for_cudnns_trust(handle, monkeypatch, how):
    """check_strides=False (or opgraph.cudnn.CHECK_STRIDES = False) binds the buffer by address with
    the declared strides, as cuDNN does and as before."""
    if how == "module":
        monkeypatch.setattr(cudnn, "CHECK_STRIDES", False)
        g, (X, W, Y), (x, w, y) = _nchw_for_nhwc(handle)
    else:
        g, (X, W, Y), (x, w, y) = _nchw_for_nhwc(handle, check_strides=False)
    g.execute({X: x, W: w, Y: y}, None, handle=handle)
    as_declared = x.as_strided([2, 4, 5, 5], [100, 1, 20, 4])  # the same memory read with X's strides
    want = torch.nn.functional.conv2d(as_declared.double(), w.double(), padding=1)
    torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4)
