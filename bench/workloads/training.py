"""Training steps of torchvision classifiers (ResNet-18, MobileNetV2) at batch 64, fp16 channels-last
224²: cross-entropy, backward, SGD with momentum on fp16 parameters (as PyTorch trains a .half()
model), through opgraph.training.train_step (one-hot cross-entropy, SGD with momentum), beside the same step in eager PyTorch (plain and
captured) and under torch.compile (the model compiled, the optimizer step compiled).

Checked before timing: one step with lr = LR != 0 and momentum 0.9 from the same initial state, against
the step of the float64 module: the loss, every parameter's gradient (= its momentum buffer after a
first step), every updated parameter and every batchnorm running statistic. (The update alone, new -
old, is not compared: in fp16 many updates round away, e.g. a batchnorm weight near 1 moves by less
than half an fp16 ulp, in PyTorch as anywhere.) fp16 training's errors against float64 are large for
some tensors (a batchnorm bias's gradient is a sum that cancels almost to zero: 3 x the best peer's
error there exceeds 2), so every finite result is timed and the tolerance rule alone judges it. Timing
then goes on stepping (lr stays LR; the arithmetic of a step does not depend on the values). Dropout is
off (p = 0), so every implementation computes the same function.

Because the fp16 check is loose where fp16 itself is, each network also has a float32 check
(`training.<arch>.b64.float32`, not timed): the same step from the same weights and input (fp16 values,
exact in float32), opgraph's plans built without TF32 (deselect_numeric_notes=[DOWN_CONVERT_INPUTS]) and
eager PyTorch in float32 (TF32 off) against the same float64 step, every output under the same rule:
there a wrong gradient cannot hide in fp16's noise."""

from __future__ import annotations

import copy
import functools
from typing import Any

from ..case import Case, Ctx, Impl, Output, Runner
from ..core.floors import Floor, roofline_layers
from ..core.registry import workload
from ..ours import VARIANTS, diagnose, engines_of, step_profile
from ..ours import build as og_build
from ..peers.torch_peers import INDUCTOR_ENGINE
from .networks import build, layer_records

LR, MOMENTUM = 0.05, 0.9


def _model(ctx: Ctx, arch: str, classes: int) -> tuple[Any, str]:
    import torch

    torch.manual_seed(0)
    model, source = build(arch, classes)
    model = model.to(ctx.device).to(memory_format=torch.channels_last).train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model, source


def _reference(model: Any, x: Any, labels: Any, pnames: list[str], snames: list[str]) -> list[Any]:
    """The float64 step: [loss, grads..., updated parameters..., running stats...]."""
    import torch
    import torch.nn.functional as F

    m = copy.deepcopy(model).double()
    params = dict(m.named_parameters())
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    with torch.enable_grad():
        loss = F.cross_entropy(m(x.double()), labels)
        loss.backward()
    grads = [params[n].grad.detach().clone() for n in pnames]
    opt.step()
    bufs = dict(m.named_buffers())
    return (
        [loss.detach().reshape(1)]
        + grads
        + [params[n].detach().clone() for n in pnames]
        + [bufs[n].detach().clone() for n in snames]
    )


def training_case(ctx: Ctx, arch: str, batch: int, float32: bool = False) -> Case:
    """The fp16 step, timed; `float32`: the float32 check of the same step (not timed, eager the only peer)."""
    import torch

    res, nb, classes = ctx.pick((224, batch, 1000), (224, min(batch, 16), 1000), (32, 8, 10))
    model, source = _model(ctx, arch, classes)
    pnames = [n for n, _ in model.named_parameters()]
    snames = [n for n, _ in model.named_buffers() if n.endswith(("running_mean", "running_var"))]
    x32 = torch.randn(nb, 3, res, res, device=ctx.device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, classes, (nb,), device=ctx.device)
    layers = roofline_layers(layer_records(copy.deepcopy(model).eval(), x32), training=True)
    model16 = model.half()
    x = x32.half()
    refs = _reference(model16, x, labels, pnames, snames)  # float64, from the same fp16 weights and input
    net = model16.float() if float32 else model16  # the module stepped: the same values, exact in float32
    x = x.float() if float32 else x
    dtype = "float32" if float32 else "float16"
    outputs = (
        [Output("loss", dtype)]
        + [Output(f"grad:{n}", dtype) for n in pnames]
        + [Output(f"param:{n}", dtype) for n in pnames]
        + [Output(f"stat:{n}", dtype) for n in snames]
    )
    exact = {"deselect_numeric_notes": ["DOWN_CONVERT_INPUTS"]} if float32 else {}

    def ours(name: str, engines: list[str] | None, tuned: bool) -> Impl:
        def setup() -> Runner:
            import opgraph as og

            m = copy.deepcopy(net)
            st = _State(m, pnames, snames)
            imported = og.from_torch(m, (x,))
            step = og.training.train_step(
                imported,
                og.training.OneHotCrossEntropy(),
                og.training.SGD(LR, momentum=MOMENTUM),
                grad_data_type=og.DataType.FLOAT if float32 else og.DataType.HALF,
            )
            plan, note = og_build(step.graph, ctx, engines, tuned, **exact)
            onehot = torch.eye(classes, device=ctx.device, dtype=x.dtype)[labels]
            pack = step.pack(x, target=onehot)
            # the momentum buffers, laid out like the parameters (the step keeps its optimizer state so)
            velocity = {n: step.param_state(n)["momentum_buffer"] for n in pnames}
            loss = pack[step.loss_uid]

            def call() -> None:
                plan.execute(pack)
                imported.write_back(pack)  # the module's batchnorm running stats

            diagnose(f"{arch} training step [{name}]", plan, pack)

            st.velocity, st.loss, st.poison = (lambda: velocity), (lambda: loss), loss
            return Runner(
                call=call,
                read=st.read,
                reset=st.reset,
                engine=engines_of(plan),
                notes=note,
                keep=(plan, step, m, st),
                after=step_profile(ctx, plan, pack),
            )

        return Impl(name, setup, role="ours", tuned=tuned)

    impls = [ours(n, e, t) for n, e, t in VARIANTS if not t or (ctx.tune and ctx.tune_networks and not float32)]
    if ctx.scale == "tiny":  # a training step's generated kernels under Triton's interpreter: too slow
        impls = [i for i in impls if not i.name.startswith("generated")]
    impls.append(Impl("torch eager", functools.partial(_torch_step, net, x, labels, pnames, snames, None)))
    impls += [
        Impl(n, functools.partial(_torch_step, net, x, labels, pnames, snames, mode), needs=frozenset(nd))
        for n, mode, nd in (
            ("torch.compile", "max-autotune-no-cudagraphs", {"compile"}),
            ("torch.compile (CUDA graphs)", "max-autotune", {"compile", "cuda"}),
        )
        if not float32 and (mode != "max-autotune" or ctx.compile_cudagraphs)
    ]
    notes = (
        f"model: {source}; one checked step at lr {LR}, momentum {MOMENTUM}; {len(outputs)} outputs checked "
        f"(loss, {len(pnames)} gradients, {len(pnames)} updated parameters, {len(snames)} running statistics)"
    )
    if float32:
        notes += (
            "; the float32 check of the fp16 row's step (not timed): opgraph without TF32, eager float32 "
            "(TF32 off) the peer that sets the tolerance"
        )
    return Case(outputs, lambda: refs, impls, Floor(layers=layers), notes=notes, sane_limit=float("inf"))


class _State:
    """A module's training state: restores it (parameters, buffers, velocities zeroed, loss poisoned)
    to what it was when this was made, and reads a step's results from it: the loss, each gradient
    (the momentum buffer after a first step from zero), each parameter and each running statistic."""

    def __init__(self, m: Any, pnames: list[str], snames: list[str]) -> None:
        self.m, self.pnames, self.snames = m, pnames, snames
        self.init_p = {n: p.detach().clone() for n, p in m.named_parameters()}
        self.init_b = {n: b.detach().clone() for n, b in m.named_buffers()}
        self.velocity: Any = dict  # () -> {param name: momentum buffer}: zeroed by reset
        self.loss: Any = lambda: None
        self.poison: Any = None

    def reset(self) -> None:
        import torch

        with torch.no_grad():
            for n, p in self.m.named_parameters():
                p.copy_(self.init_p[n])
            for n, b in self.m.named_buffers():
                b.copy_(self.init_b[n])
            for v in self.velocity().values():
                v.zero_()
            if self.poison is not None:
                self.poison.fill_(float("nan"))

    def read(self, _: Any) -> list[Any]:
        params, bufs = dict(self.m.named_parameters()), dict(self.m.named_buffers())
        v = self.velocity()
        loss = self.loss()
        return (
            [None if loss is None else loss.reshape(-1)[:1]]
            + [v.get(n) for n in self.pnames]
            + [params[n].detach() for n in self.pnames]
            + [bufs[n] for n in self.snames]
        )


def _torch_step(model: Any, x: Any, labels: Any, pnames: list[str], snames: list[str], mode: str | None) -> Runner:
    import torch
    import torch.nn.functional as F

    if mode is not None:
        torch._dynamo.reset()  # nothing compiled for another mode serves this one
    if mode == "max-autotune":  # the batch never moves: Inductor's CUDA graphs need not copy it each step
        torch._dynamo.mark_static_address(x)
    m = copy.deepcopy(model)
    st = _State(m, pnames, snames)  # the initial state, before the warm-up steps below change it
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM, foreach=True)
    net = m if mode is None else torch.compile(m, mode=mode, dynamic=False)
    # the optimizer step is compiled without Inductor's CUDA graphs in both modes: under them, its graph
    # read tensors that the model's graphs had overwritten ("accessing tensor output of CUDAGraphs that
    # has been overwritten by a subsequent run" in SGD.step, every repeat of 2026-11-26, with
    # cudagraph_mark_step_begin); the model's forward and backward keep the mode's CUDA graphs
    opt_step = opt.step if mode is None else torch.compile(opt.step, mode="max-autotune-no-cudagraphs", dynamic=False)
    out: dict[str, Any] = {}

    def call() -> Any:
        if mode == "max-autotune":  # a new step: Inductor's CUDA-graph trees may reuse the last step's outputs
            torch.compiler.cudagraph_mark_step_begin()  # (without it: "accessing tensor output of CUDAGraphs
            # that has been overwritten by a subsequent run", 2026-11-26)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), labels)
        loss.backward()
        opt_step()
        # detached: a loss kept with its autograd graph keeps the step's AccumulateGrad nodes alive, and
        # the next (captured, side-stream) backward then syncs with the default stream and breaks capture
        out["loss"] = loss = loss.detach()
        return loss

    def velocity() -> dict[str, Any]:
        params = dict(m.named_parameters())
        return {n: opt.state[params[n]]["momentum_buffer"] for n in pnames if params[n] in opt.state}

    for _ in range(3):  # compile; create the momentum buffers (a captured step needs them to exist)
        call()
    if x.is_cuda:
        torch.cuda.synchronize()
    st.velocity, st.loss = velocity, (lambda: out["loss"])
    engine = (
        "ATen + autograd + SGD (foreach)"
        if mode is None
        else INDUCTOR_ENGINE + " + compiled SGD step" + (" (no CUDA graphs)" if mode == "max-autotune" else "")
    )
    return Runner(
        call=call,
        read=st.read,
        reset=st.reset,
        engine=engine,
        graph_native=mode == "max-autotune",
        capturable=mode != "max-autotune",
        notes=f"mode={mode}" if mode else "",
        keep=(m, opt, net, st),
    )


for _arch, _b in (("resnet18", 64), ("mobilenet_v2", 64)):
    workload(
        f"training.{_arch}.b{_b}",
        group=f"training-{_arch}",
        kind="training",
        minutes=2.0,
        quick=_arch == "resnet18",
        title=f"{_arch} training step batch {_b}, fp16 channels-last 224², SGD momentum",
    )(functools.partial(training_case, arch=_arch, batch=_b))
    workload(
        f"training.{_arch}.b{_b}.float32",
        group=f"training-{_arch}",
        kind="training",
        minutes=0.5,
        quick=False,
        timed=False,
        title=f"{_arch} training step batch {_b}, float32 check of the step above (not timed)",
    )(functools.partial(training_case, arch=_arch, batch=_b, float32=True))
