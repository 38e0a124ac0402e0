"""opgraph.core.device: naming devices. "cuda" is PyTorch's current device (a data-parallel rank's own
GPU after torch.cuda.set_device), "cuda:N" the one named; faked here with no GPU."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

from opgraph.core import device as device_mod  # noqa: E402
from opgraph.core.errors import GraphError  # noqa: E402


@pytest.fixture
def two_gpus(monkeypatch):
    current = {"index": 1}
    props = types.SimpleNamespace(name="fake H200", major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(device_mod, "cuda_usable", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    return current


def test_cuda_is_the_current_device(two_gpus):
    assert device_mod.resolve_device("cuda").index == 1
    assert device_mod.resolve_device("cuda").torch_name == "cuda:1"
    two_gpus["index"] = 0
    assert device_mod.resolve_device("cuda").torch_name == "cuda:0"


def test_cuda_n_is_the_device_named(two_gpus):
    assert device_mod.resolve_device("cuda:0").index == 0
    assert device_mod.resolve_device(" CUDA:1 ").index == 1
    assert device_mod.resolve_device("cpu").torch_name == "cpu"


def test_unknown_devices_are_refused():
    with pytest.raises(GraphError, match="unknown device"):
        device_mod.resolve_device("tpu")
