"""opgraph.training's step graphs of hand-built graphs (`step_graph`: forward, softmax cross-entropy,
backward, SGD with momentum updating parameters and velocities in place) and of imported classifiers
(`train_step` with OneHotCrossEntropy) against PyTorch autograd + torch.optim.SGD; the deprecated
`sgd_momentum` and `classifier_step`, wrappers of them, still give the same steps.

On the CPU: the reference engine in float64 (a conv-batchnorm-relu / depthwise / pointwise /
pool / classifier net, several steps with a changing learning rate); marked interpreter, the same
step through generated Triton kernels, and double buffering by table flips between emulated
replays; example 09's CPU mode. Marked gpu: the CUDA-graph training loop of example 09 in small
form, and examples 09 and 11 themselves.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

import opgraph as og
from opgraph.tools.samples import nhwc
from opgraph.testing import clone, empty_like_desc
from opgraph.training import SGD, OneHotCrossEntropy, softmax_cross_entropy, step_graph, train_step

from .helpers import requires_cuda, run_example

torch = pytest.importorskip("torch")
F = torch.nn.functional

DT = og.DataType
EXAMPLES = Path(__file__).parent.parent / "examples"
CLASSES = 5


def small_net(dt, n=4, c=2, hw=6, k=4, k2=6, by_reference=False):
    """conv3x3 -> batchnorm -> relu -> depthwise 3x3 / 2 + bias -> relu -> 1x1 conv + bias -> relu ->
    global average pool -> 1x1-conv classifier + bias -> softmax cross-entropy: the blocks of the
    examples. Returns (graph, loss, params)."""
    g = og.Graph("net", io_data_type=dt, intermediate_data_type=dt, compute_data_type=dt)

    def filt(dim, name):
        return g.tensor(dim=dim, stride=nhwc(dim), name=name)

    def chan(ch, name):
        return g.tensor(dim=[1, ch, 1, 1], name=name)

    x = g.tensor(dim=[n, c, hw, hw], stride=nhwc([n, c, hw, hw]), name="x", is_by_reference=by_reference)
    onehot = g.tensor(dim=[n, CLASSES, 1, 1], name="onehot", is_by_reference=by_reference)
    w1, scale, shift = filt([k, c, 3, 3], "w1"), chan(k, "bn_scale"), chan(k, "bn_bias")
    dw, dwb = filt([k, 1, 3, 3], "dw"), chan(k, "dw_b")
    pw, pwb = filt([k2, k, 1, 1], "pw"), chan(k2, "pw_b")
    fc, fcb = filt([CLASSES, k2, 1, 1], "fc"), chan(CLASSES, "fc_b")
    h, mean, inv, _, _ = g.batchnorm(g.conv_fprop(x, w1, padding=1), scale, shift, epsilon=1e-5)
    mean.set_output(True).set_name("bn_mean").set_data_type(dt)
    inv.set_output(True).set_name("bn_inv_variance").set_data_type(dt)
    h = g.relu(g.bias(g.conv_fprop(g.relu(h), dw, padding=1, stride=2), dwb))
    h = g.relu(g.bias(g.conv_fprop(h, pw), pwb))
    pooled = g.reduction(h, mode="avg").set_dim([n, k2, 1, 1]).set_data_type(dt)
    logits = g.bias(g.conv_fprop(pooled, fc), fcb)
    loss = softmax_cross_entropy(g, logits, onehot).set_output(True)
    return g, loss, [w1, scale, shift, dw, dwb, pw, pwb, fc, fcb]


def torch_net(p, x, labels):
    h = F.conv2d(x, p["w1"], padding=1)
    h = F.batch_norm(h, None, None, p["bn_scale"].reshape(-1), p["bn_bias"].reshape(-1), training=True, eps=1e-5)
    h = F.relu(F.conv2d(F.relu(h), p["dw"], padding=1, stride=2, groups=p["dw"].shape[0]) + p["dw_b"])
    h = F.relu(F.conv2d(h, p["pw"]) + p["pw_b"])
    logits = F.conv2d(h.mean(dim=(2, 3), keepdim=True), p["fc"]) + p["fc_b"]
    return F.cross_entropy(logits.flatten(1), labels)


def sgd_step(g, loss, params, *, weight_decay=0.0, **options):
    """The step graph of SGD with momentum 0.9 (the learning rate a device scalar, set per step)."""
    return step_graph(g, loss, params, SGD(0.1, momentum=0.9, weight_decay=weight_decay), **options)


def param_uids(step):
    return [s.uid for s in step.params]


def velocity(step, uid):
    return next(s.state["momentum_buffer"] for s in step.params if s.uid == uid)


def velocity_uids(step):
    return [s.state["momentum_buffer"] for s in step.params]


def init_pack(step, rng, lr=0.1, momentum=0.9):
    """Every buffer of the step graph: parameters (scale near 1), optimizer state, batch, outputs."""
    f = step.graph.final
    step.optimizer.set(lr=lr, momentum=momentum)
    pack = step.state_pack()
    for uid in (*param_uids(step), *f.inputs):
        if uid not in pack:
            d = f.tensors[uid]
            pack[uid] = empty_like_desc(d)
            pack[uid][...] = rng.uniform(-0.5, 0.5, d.dim) + (1.0 if d.name == "bn_scale" else 0.0)
    for uid in f.outputs:
        pack.setdefault(uid, empty_like_desc(f.tensors[uid]))
    return pack


def new_batch(f, rng):
    """(x values, labels, one-hot) for the step graph `f`."""
    xd = f.tensors[f.tensor("x").uid]
    n = xd.dim[0]
    labels = rng.integers(0, CLASSES, n)
    onehot = np.eye(CLASSES)[labels].reshape(n, CLASSES, 1, 1)
    return rng.uniform(-1, 1, xd.dim), labels, onehot


def feed(pack, step, x, onehot, lr=None):
    f = step.graph.final
    pack[f.tensor("x").uid][...] = x
    pack[f.tensor("onehot").uid][...] = onehot
    if lr is not None:
        pack[step.scalar("lr").uid][...] = lr


def params_of(step, pack):
    f = step.graph.final
    return {f.tensors[u].name: np.asarray(pack[u], dtype=np.float64) for u in param_uids(step)}


# -- the reference engine, float64 ----------------------------------------------------------------------


def test_sgd_momentum_steps_match_torch_optim(rng):
    """Three steps, the learning rate changed between them (a device scalar), weight decay on:
    losses, parameters and velocities equal torch.optim.SGD's to float64 precision."""
    g, loss, params = small_net(DT.DOUBLE)
    step = sgd_step(g, loss, params, weight_decay=1e-2)
    plan = step.graph.build(device="cpu")
    f = step.graph.final
    pack = init_pack(step, rng)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params_of(step, pack).items()}
    opt = torch.optim.SGD(p.values(), lr=0.1, momentum=0.9, weight_decay=1e-2)
    for i, lr in enumerate((0.1, 0.05, 0.2)):
        x, labels, onehot = new_batch(f, rng)
        feed(pack, step, x, onehot, lr)
        plan.execute(pack)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        want = torch_net(p, torch.tensor(x), torch.tensor(labels))
        want.backward()
        opt.step()
        assert float(pack[step.loss_uid].reshape(-1)[0]) == pytest.approx(want.item(), rel=1e-12), i
        got = params_of(step, pack)
        for name, t in p.items():
            np.testing.assert_allclose(got[name], t.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{name} {i}")
            v = pack[velocity(step, f.tensor(name).uid)]
            np.testing.assert_allclose(
                v,
                opt.state[t]["momentum_buffer"].numpy(),
                rtol=1e-10,
                atol=1e-12,
                err_msg=f"velocity of {name} at step {i}",
            )


def test_loss_decreases_on_a_fixed_batch(rng):
    g, loss, params = small_net(DT.FLOAT)
    step = sgd_step(g, loss, params)
    plan = step.graph.build(device="cpu")
    f = step.graph.final
    pack = init_pack(step, rng, lr=0.2)
    x, _, onehot = new_batch(f, rng)
    feed(pack, step, x, onehot)
    losses = []
    for _ in range(8):
        plan.execute(pack)
        losses.append(float(pack[step.loss_uid].reshape(-1)[0]))
    assert all(b < a for a, b in itertools.pairwise(losses)) and losses[-1] < 0.75 * losses[0], losses


def test_learning_rate_is_read_at_run_time(rng):
    """lr = 0 leaves the parameters bit for bit and still accumulates the velocity; the same plan
    then steps with the new rate, no rebuild."""
    g, loss, params = small_net(DT.DOUBLE)
    step = sgd_step(g, loss, params, keep_grads=True)
    plan = step.graph.build(device="cpu")
    f = step.graph.final
    pack = init_pack(step, rng, lr=0.0)
    x, _, onehot = new_batch(f, rng)
    feed(pack, step, x, onehot)
    before = {u: clone(pack[u]) for u in param_uids(step)}
    plan.execute(pack)
    for slot in step.params:
        np.testing.assert_array_equal(pack[slot.uid], before[slot.uid])
        grad_out = pack[slot.grad_uid]
        np.testing.assert_array_equal(pack[slot.state["momentum_buffer"]], grad_out)  # v = 0.9 * 0 + dW
    feed(pack, step, x, onehot, lr=0.5)
    plan.execute(pack)
    for uid, w in before.items():
        assert not np.array_equal(pack[uid], w), f.tensors[uid].name


def test_step_graph_structure():
    g, loss, params = small_net(DT.FLOAT, by_reference=True)
    step = sgd_step(g, loss, params)
    f = step.graph.final
    assert f.tensors[f.tensor("x").uid].is_by_reference and f.tensors[f.tensor("onehot").uid].is_by_reference
    for uid in param_uids(step):  # updated in place: the same UID written by a pointwise op that reads it
        writer = f.producer(uid)
        assert writer is not None and writer.kind == "pointwise" and uid in writer.input_uids()
        assert uid in f.outputs and f.tensors[uid].name == g.final.tensors[uid].name
    assert not any(t.name.startswith("grad_") for t in (f.tensors[u] for u in f.outputs))  # gradients virtual
    assert f.tensors[step.seed_uid].name == "grad_loss" and step.seed_uid in f.inputs
    assert f.tensors[step.scalar("lr").uid].dim == (1,) and f.tensors[step.scalar("momentum").uid].dim == (1,)
    assert step.loss_uid == g.final.tensor("loss").uid


def test_errors_name_the_rule():
    g, loss, params = small_net(DT.FLOAT)
    with pytest.raises(og.GraphError) as err:
        sgd_step(g, g.final.tensor("bn_mean").uid, params)
    assert err.value.rule == "training.loss"
    g, loss, params = small_net(DT.FLOAT)
    with pytest.raises(og.GraphError) as err:
        sgd_step(g, loss, [*params, g.final.tensor("bn_mean").uid])
    assert err.value.rule == "training.param"
    with pytest.raises(og.AttributeValueError) as err:
        step_graph(g, loss, params, "sgd")
    assert err.value.rule == "training.optimizer"


def test_the_deprecated_sgd_momentum_warns_and_is_the_same_step(rng):
    """sgd_momentum is step_graph with SGD(lr, momentum, weight_decay): the same graph, its scalars named
    lr and momentum, the same results."""
    from opgraph.training import sgd_momentum

    g, loss, params = small_net(DT.DOUBLE)
    with pytest.warns(DeprecationWarning, match="step_graph"):
        old = sgd_momentum(g, loss, params, weight_decay=1e-2)
    new = sgd_step(g, loss, params, weight_decay=1e-2)
    assert old.graph.final.tensors[old.lr.uid].name == "lr" and set(old.velocity) == set(param_uids(new))
    pack = old.state(lr=0.1, momentum=0.9)
    f = old.graph.final
    start = init_pack(new, rng)
    for uid in (*param_uids(new), *f.inputs):  # (parameters, updated in place, are outputs)
        pack.setdefault(uid, clone(start[uid]))
    for uid in f.outputs:
        pack.setdefault(uid, empty_like_desc(f.tensors[uid]))
    x, _, onehot = new_batch(f, rng)
    for p, step in ((pack, old.step_graph), (start, new)):
        feed(p, step, x, onehot, 0.1)
        step.graph.build(device="cpu").execute(p)
    for uid in (*param_uids(new), new.loss_uid):
        np.testing.assert_array_equal(pack[uid], start[uid])
    for uid, v in old.velocity.items():
        np.testing.assert_array_equal(pack[v.uid], start[velocity(new, uid)])


def test_example_09_cpu_mode():
    out = run_example("09_cuda_graph_training.py", OPGRAPH_EXAMPLE_CPU="1")
    assert "PyTorch vs op by op" in out, out


# -- generated kernels under the interpreter ------------------------------------------------------------


def _tiny():
    return small_net(DT.FLOAT, n=2, c=1, hw=4, k=2, k2=4, by_reference=True)


@pytest.mark.interpreter
def test_triton_step_matches_the_reference_engine(rng):
    g, loss, params = _tiny()
    step = sgd_step(g, loss, params, weight_decay=1e-3)
    f = step.graph.final
    plans = {e: step.graph.build(device="cpu", engines=[e]) for e in ("reference", "triton")}
    assert all(s.config.engine == "triton" for s in plans["triton"].steps), plans["triton"].describe()
    start = init_pack(step, rng)
    packs = {e: {u: clone(v) for u, v in start.items()} for e in plans}
    for _ in range(2):
        x, _, onehot = new_batch(f, rng)
        for e, plan in plans.items():
            feed(packs[e], step, x, onehot)
            plan.execute(packs[e])
    for uid in (*param_uids(step), *velocity_uids(step), step.loss_uid):
        np.testing.assert_allclose(
            packs["triton"][uid], packs["reference"][uid], rtol=1e-4, atol=1e-5, err_msg=f.tensors[uid].name
        )


def _emulated_capture(plan, pack):
    """What a captured CUDA graph holds: the plan bound once to the buffers of `pack` (workspace
    included), its launches replayed as they are; by-reference tensors are read through the address
    table (what cudagraph.populate records; the interpreter runs it)."""
    bound = plan.bind(pack, None)
    return bound.run


@pytest.mark.interpreter
def test_double_buffering_by_table_flips_between_replays(rng):
    """Example 09's loop on generated kernels: x and onehot by reference, batches alternating between
    buffers A and B, the table flipped with set_address and the learning rate written between
    'replays'; losses and parameters equal those of plan.execute at every step."""
    g, loss, params = _tiny()
    step = sgd_step(g, loss, params)
    f = step.graph.final
    plan = step.graph.build(device="cpu", engines=["triton"])
    x_uid, oh_uid = f.tensor("x").uid, f.tensor("onehot").uid
    start = init_pack(step, rng)
    batches = [new_batch(f, rng) for _ in range(3)]
    rates = [0.1, 0.3, 0.05]

    eager = {u: clone(v) for u, v in start.items()}
    eager_losses = []
    for (x, _, onehot), lr in zip(batches, rates):
        feed(eager, step, x, onehot, lr)
        plan.execute(eager)
        eager_losses.append(float(eager[step.loss_uid].reshape(-1)[0]))

    pack = {u: clone(v) for u, v in start.items()}
    bufs = {x_uid: [pack[x_uid], clone(pack[x_uid])], oh_uid: [pack[oh_uid], clone(pack[oh_uid])]}
    replay = _emulated_capture(plan, pack)
    losses = []
    for i, ((x, _, onehot), lr) in enumerate(zip(batches, rates)):
        k = i % 2
        bufs[x_uid][k][...] = x
        bufs[oh_uid][k][...] = onehot
        plan.set_address(x_uid, bufs[x_uid][k])
        plan.set_address(oh_uid, bufs[oh_uid][k])
        pack[step.scalar("lr").uid][...] = lr
        replay()
        losses.append(float(pack[step.loss_uid].reshape(-1)[0]))
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-6)
    for uid in param_uids(step):
        np.testing.assert_allclose(pack[uid], eager[uid], rtol=1e-6, atol=1e-7, err_msg=f.tensors[uid].name)


@pytest.mark.interpreter
def test_set_address_after_a_device_side_write():
    """Flipping by a device-side copy, then back with set_address (mixing example 09's two ways)."""
    g = og.Graph("flip", io_data_type=DT.FLOAT)
    x = g.tensor(dim=[4], name="x", is_by_reference=True)
    y = g.relu(x).set_output(True).set_name("y")
    plan = g.build(device="cpu", engines=["triton"])
    a, b = np.ones(4, np.float32), np.full(4, 2.0, np.float32)
    plan.execute({x: a, y: np.zeros(4, np.float32)})
    slot = plan.table_slot(x)
    plan.address_table[slot] = b.__array_interface__["data"][0]  # a device-side flip to b
    plan.set_address(x, a)  # ... and back to a
    assert plan.address_table[slot].item() == a.__array_interface__["data"][0]


# -- on the GPU ---------------------------------------------------------------------------------------------


def _gpu_pack(step, rng):
    from opgraph.core.torch_interop import pack_to_device

    return pack_to_device(init_pack(step, rng), "cuda")


@pytest.mark.gpu
@requires_cuda
def test_cuda_graph_training_loop_matches_op_by_op(rng):
    """One capture, 12 replays: the learning rate changed before each, the batch alternating between
    two buffers (flips by set_address, then by device-side copies into the address table); losses
    and parameters equal those of plan.execute at every step."""
    g, loss, params = small_net(DT.FLOAT, n=32, c=3, hw=16, k=16, k2=32, by_reference=True)
    step = sgd_step(g, loss, params, weight_decay=1e-4)
    f = step.graph.final
    plan = step.graph.build(device="cuda")
    x_uid, oh_uid, lr_uid = f.tensor("x").uid, f.tensor("onehot").uid, step.scalar("lr").uid
    start = _gpu_pack(step, rng)
    steps = 12
    batches = [new_batch(f, rng) for _ in range(steps)]
    rates = [0.1 * (1 + math.cos(math.pi * i / steps)) / 2 for i in range(steps)]

    def put(buf, value):
        buf.copy_(torch.as_tensor(np.asarray(value, dtype=np.float32)).reshape(buf.shape))

    eager = {u: v.clone() if isinstance(v, torch.Tensor) else v for u, v in start.items()}
    eager_losses = []
    for (x, _, onehot), lr in zip(batches, rates):
        put(eager[x_uid], x)
        put(eager[oh_uid], onehot)
        put(eager[lr_uid], lr)
        plan.execute(eager)
        eager_losses.append(float(eager[step.loss_uid].reshape(-1)[0]))

    pack = {u: v.clone() if isinstance(v, torch.Tensor) else v for u, v in start.items()}
    state = {u: pack[u].clone() for u in (*param_uids(step), *velocity_uids(step))}
    bufs = {u: [pack[u], torch.empty_like(pack[u])] for u in (x_uid, oh_uid)}
    graph = plan.populate_cuda_graph(pack)  # its warm-up execute trains one step: restore the state
    for u, v in state.items():
        pack[u].copy_(v)
    tables = []  # the table pointing at buffers A, then at buffers B: device-side flips copy them in
    for k in range(2):
        plan.set_address(x_uid, bufs[x_uid][k])
        plan.set_address(oh_uid, bufs[oh_uid][k])
        tables.append(plan.address_table.clone())
    losses = []
    for i, ((x, _, onehot), lr) in enumerate(zip(batches, rates)):
        k = i % 2
        put(bufs[x_uid][k], x)
        put(bufs[oh_uid][k], onehot)
        if i < steps // 2:
            plan.set_address(x_uid, bufs[x_uid][k])
            plan.set_address(oh_uid, bufs[oh_uid][k])
        else:  # then device-side flips only (see test_set_address_after_a_device_side_write)
            plan.address_table.copy_(tables[k])
        pack[lr_uid].fill_(lr)
        graph.replay()
        losses.append(float(pack[step.loss_uid].reshape(-1)[0]))
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for uid in param_uids(step):
        torch.testing.assert_close(pack[uid], eager[uid], rtol=1e-5, atol=1e-6)
    assert eager_losses[-1] < eager_losses[0]


@pytest.mark.gpu
@requires_cuda
def test_example_09_on_the_gpu():
    out = run_example("09_cuda_graph_training.py")
    assert "CUDA graph vs op by op" in out


@pytest.mark.gpu
@pytest.mark.slow
@requires_cuda
def test_example_11_on_the_gpu():
    pytest.importorskip("sklearn")
    out = run_example("11_train_mobilenet_digits.py")
    assert "final test accuracy" in out


# -- an imported PyTorch classifier trained through train_step (one-hot cross-entropy, SGD) --------------


@pytest.mark.parametrize("arch,batch,tol", [("resnet18", 4, 1e-9), ("mobilenet_v2", 8, 1e-6)])
def test_classifier_trains_like_torch_sgd(arch, batch, tol):
    """Two steps of train_step(OneHotCrossEntropy(), SGD(momentum)) on the CPU reference engine against
    cross_entropy + backward + torch.optim.SGD(momentum) on a copy: parameters, running stats and
    the loss agree (float64; MobileNetV2's train-mode batchnorm over a few values per channel in its
    deepest layers amplifies rounding, hence its looser bound)."""
    torch = pytest.importorskip("torch")
    import copy

    from torch import nn

    from .frontends.tv_models import build

    torch.manual_seed(0)
    model = build(arch, num_classes=10).double().train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    ref = copy.deepcopy(model)
    x = torch.randn(batch, 3, 32, 32, dtype=torch.float64)
    labels = torch.arange(batch) % 10
    imported = og.from_torch(model, (x,))
    step = train_step(imported, OneHotCrossEntropy(), SGD(0.1, momentum=0.9))
    assert len(imported.graph.final.outputs) < len(step.graph.final.outputs)  # the import is untouched
    plan = step.build(device="cpu")
    pack = step.pack(x, target=torch.eye(10, dtype=torch.float64)[labels])
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        plan.execute(pack)
        imported.write_back(pack)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(x), labels)
        loss.backward()
        opt.step()
    with torch.no_grad():
        scale = max(float(p.abs().max()) for p in ref.parameters())
        worst = max(float((p - q).abs().max()) for p, q in zip(model.parameters(), ref.parameters()))
        stats = max(float((a.double() - b.double()).abs().max()) for a, b in zip(model.buffers(), ref.buffers()))
    assert worst <= tol * scale and stats <= tol * 10
    want = float(loss.detach())
    assert abs(float(np.asarray(pack[step.loss_uid]).ravel()[0]) - want) <= tol * want
    assert int(model.bn1.num_batches_tracked if arch == "resnet18" else model.features[0][1].num_batches_tracked) == 2


@pytest.mark.parametrize("dtype,want", [("half", "HALF"), ("float", "FLOAT"), ("explicit", "FLOAT")])
def test_classifier_step_gradients_have_the_parameters_type(dtype, want):
    """Like PyTorch, an fp16 model's gradients are fp16 (dgrad/wgrad on fp16 operands), unless
    grad_data_type says otherwise (the deprecated classifier_step, a train_step wrapper, picks it)."""
    torch = pytest.importorskip("torch")

    from .frontends.tv_models import build

    model = build("resnet18", num_classes=10).train()
    model = model.half() if dtype in ("half", "explicit") else model.float()
    x = torch.randn(2, 3, 32, 32, dtype=next(model.parameters()).dtype)
    with pytest.warns(DeprecationWarning, match="train_step"):
        cs = og.training.classifier_step(
            og.from_torch(model, (x,)), **({"grad_data_type": og.DataType.FLOAT} if dtype == "explicit" else {})
        )
    final = cs.step.graph.final
    kinds = {}
    for n in final.nodes:
        if n.kind in ("conv_dgrad", "conv_wgrad"):
            role = "loss" if n.kind == "conv_wgrad" else n.op.INPUTS[0]
            kinds.setdefault(n.kind, set()).add(final.tensors[n.input(role)].data_type.name)
    assert kinds == {"conv_dgrad": {want}, "conv_wgrad": {want}}, kinds


@pytest.mark.parametrize("engines", [None, pytest.param(["triton"], marks=pytest.mark.interpreter)])
def test_fp16_classifier_last_layer_gradients_are_as_accurate_as_torch(engines):
    """An fp16 classifier with 1000 classes, batch 64 and small logits (an untrained network's, as in
    the benchmark's training.resnet18.b64): dlogits = (softmax - onehot) / 64 are below fp16's
    smallest normal. Formed in fp32 and rounded once, as PyTorch forms them, the bias gradient (their
    batch sum) and the weight gradient are as close to the float64 step's as eager fp16 PyTorch's.
    (Differentiating the loss's ops with fp16 intermediates was about 5 times farther: 9.3e-4.)"""
    import copy

    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1000)).half().train()
    x = (0.1 * torch.randn(64, 64)).half()
    labels = torch.arange(64)
    want = copy.deepcopy(model).double()
    F.cross_entropy(want(x.double()), labels).backward()
    eager = copy.deepcopy(model)
    F.cross_entropy(eager(x), labels).backward()
    step = train_step(
        og.from_torch(model, (x,)), OneHotCrossEntropy(), SGD(0.1, momentum=0.9), grad_data_type=og.DataType.HALF
    )
    plan = step.build(device="cpu", **({"engines": engines} if engines else {}))
    pack = step.pack(x, target=torch.eye(1000, dtype=torch.float16)[labels])
    plan.execute(pack)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm())

    for key in ("0.bias", "0.weight"):
        grad = step.param_state(key)["momentum_buffer"]  # the gradient, after a first step from zero
        ref = want.get_parameter(key).grad
        err, eager_err = rel(grad, ref), rel(eager.get_parameter(key).grad, ref)
        assert err <= 1.25 * eager_err, (key, err, eager_err)


def test_classifier_step_needs_one_logits_output():
    torch = pytest.importorskip("torch")
    from torch import nn

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    imported = og.from_torch(TwoHeads().double(), (torch.randn(2, 4, dtype=torch.float64),))
    with pytest.raises(og.GraphError) as info, pytest.warns(DeprecationWarning):
        og.training.classifier_step(imported)
    assert info.value.rule == "training.classifier"
    with pytest.raises(og.GraphError) as info:
        train_step(imported, OneHotCrossEntropy(), SGD(0.1))
    assert info.value.rule == "training.outputs"
