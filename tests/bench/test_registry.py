"""The workload registry (bench.core.registry) and the suite's own registrations, on the CPU."""

from __future__ import annotations

import pytest

from bench.core.registry import Registry, WorkloadSpec


def make(_ctx):  # pragma: no cover - never called here
    raise AssertionError


@pytest.fixture
def reg() -> Registry:
    r = Registry()
    r.workload("conv.a.fp16", group="conv-fp16", title="A")(make)
    r.workload("conv.a.bf16", group="conv-bf16", title="A bf16")(make)
    r.workload("net.big", group="networks", title="big", kind="network", quick=False)(make)
    return r


def test_select_by_group_id_glob_and_all(reg):
    assert [s.id for s in reg.select(["conv-bf16"])] == ["conv.a.bf16"]
    assert [s.id for s in reg.select(["net.big"])] == ["net.big"]
    assert [s.id for s in reg.select(["conv.*"])] == ["conv.a.fp16", "conv.a.bf16"]
    assert [s.id for s in reg.select(["all"])] == ["conv.a.fp16", "conv.a.bf16", "net.big"]
    assert [s.id for s in reg.select([])] == ["conv.a.fp16", "conv.a.bf16", "net.big"]
    assert [s.id for s in reg.select(["net.big", "conv-fp16", "conv.a.fp16"])] == ["conv.a.fp16", "net.big"]


def test_the_two_halves_by_kind_cover_the_suite_once(reg):
    reg.workload("train.step", group="training-x", title="step", kind="training")(make)
    reg.workload("host.tiny", group="host", title="tiny", kind="host")(make)
    assert [s.id for s in reg.select(["kernels"])] == ["conv.a.fp16", "conv.a.bf16", "host.tiny"]
    assert [s.id for s in reg.select(["models"])] == ["net.big", "train.step"]


def test_the_suites_halves_split_every_group_whole():
    from bench import workloads
    from bench.core.registry import REGISTRY

    workloads.load()
    kernels, models = ({s.group for s in REGISTRY.select([h])} for h in ("kernels", "models"))
    assert kernels and models and not kernels & models
    assert kernels | models == set(REGISTRY.groups())


def test_quick_keeps_the_smoke_test_workloads(reg):
    assert [s.id for s in reg.select(["all"], quick=True)] == ["conv.a.fp16", "conv.a.bf16"]


def test_unknown_names_and_duplicates_are_refused(reg):
    with pytest.raises(KeyError, match="groups: conv-fp16"):
        reg.select(["nope"])
    with pytest.raises(ValueError, match="twice"):
        reg.workload("conv.a.fp16", group="x", title="again")(make)


@pytest.mark.parametrize("kw", [dict(id="has space"), dict(kind="other"), dict(group="all"), dict(group="")])
def test_spec_fields_are_checked(kw):
    base = dict(id="ok", group="g", title="t", make=make)
    base.update(kw)
    with pytest.raises(ValueError):
        WorkloadSpec(**base)


def test_groups_in_registration_order(reg):
    assert list(reg.groups()) == ["conv-fp16", "conv-bf16", "networks"]


def test_the_suite_registers_what_issue_13_asks_for():
    from bench import workloads
    from bench.core.registry import REGISTRY

    workloads.load()
    ids = set(REGISTRY.groups()) | {s.id for s in REGISTRY.specs()}
    for want in (
        "memory",
        "conv-fp16",
        "conv-more-bf16",
        "conv-bwd-fp16",
        "matmul",
        "networks-resnet50-b256",
        "training-resnet18",
        "host",
        "conv.stem_7x7s2_c3.fp16",
        "conv.r50_3x3s2_c128.bf16",
        "conv.r50_1x1s2_c256_k512.fp16",
        "conv.resnext_3x3_g32.bf16",
        "networks.resnet50.b256",
        "mlp.fwd.bf16",
        "mlp.fwd_bwd.bf16",
        "matmul.bias_gelu.bf16",
        "conv_bwd.sbr_wgrad.bf16",
        "memory.batchnorm_bwd.fp16",
    ):
        assert want in ids, want
    assert all(s.kind in ("kernel", "network", "training", "host") for s in REGISTRY.specs())


def test_repeated_suite_flags_select_every_named_group():
    """`--suite a --suite b` selects both (argparse kept only the last: a run silently measured one group)."""
    from bench import workloads  # noqa: F401 - registers the suite
    from bench.run import parse, selection

    args = parse(["--suite", "zoo-llama-infer", "--suite", "zoo-bert-infer", "zoo-vit-train"])
    ids = {s.id for s in selection(args)}
    assert {"zoo.llama.infer.b8", "zoo.bert.infer.b32", "zoo.vit.train.b64"} <= ids
