"""The ecosystem models' workloads (bench/workloads/zoo.py) dry-run on the CPU at tiny sizes
(reference engine, eager PyTorch): every output of every implementation is checked against the
float64 module before anything would be timed. timm's workloads skip where timm is not installed."""

from __future__ import annotations

import importlib.util

import pytest

from .helpers import dry_run, dry_run_step

pytestmark = pytest.mark.slow


def _impls(w):
    assert not w["error"], w["error"]
    return {i["impl"]: i for i in w["impls"]}


@pytest.mark.parametrize("group", ["zoo-llama-infer", "zoo-bert-infer"])
def test_inference_workload_checks_opgraph_and_eager(tmp_path, group):
    (w,) = dry_run(tmp_path, "--suite", group, "--repeats", "1")["runs"][0]["workloads"]
    impls = _impls(w)
    for name in ("opgraph", "torch eager"):
        i = impls[name]
        assert i["status"] == "ok" and set(i["errors"]) == {"out"}, (name, i["error"])
        assert i["verdict"]["passed"], (name, i["verdict"])
        assert 0 < i["errors"]["out"] < 0.02, (name, i["errors"])  # bf16 through a tiny model
    assert impls["opgraph"]["engine"] == "reference"
    assert impls["torch.compile (default mode)"]["status"] == "unavailable"


def test_llama_training_step_checks_every_gradient_and_parameter(tmp_path):
    w, names, n_params = dry_run_step(tmp_path, "zoo-llama-train")
    assert names[0] == "loss" and n_params == 21 and len(names) == 1 + 2 * n_params  # 2 layers, untied head
    impls = _impls(w)
    for name in ("opgraph", "torch eager"):
        i = impls[name]
        assert i["status"] == "ok" and set(i["errors"]) == set(names), (name, i["error"])
        # bf16 mixed precision of a tiny model: within 3% of the float64 step on every output (eager's
        # CPU autocast, the tolerance's basis here, casts differently from the CUDA rules opgraph follows)
        assert all(e is not None and e < 0.03 for e in i["errors"].values()), (name, i["errors"])


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="timm is not installed")
@pytest.mark.parametrize("group", ["zoo-vit-train", "zoo-convnext-infer"])
def test_timm_workloads_run(tmp_path, group):
    (w,) = [v for v in dry_run(tmp_path, "--suite", group, "--repeats", "1")["runs"][0]["workloads"]]
    assert _impls(w)["torch eager"]["status"] == "ok"


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_unpadded_sdpa_gives_no_mask_while_tracing_and_the_same_output(family):
    """The zoo's attention (zoo.unpadded_sdpa): under torch.export, as under torch.compile, transformers'
    own SDPA mask function builds a dense mask for an input without padding; ours gives none (the Llama's
    attention is SDPA's is_causal), and the outputs agree with transformers' SDPA."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bench.workloads.zoo import unpadded_sdpa

    def model(attn):
        sizes = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4}
        sizes |= {"intermediate_size": 64, "attn_implementation": attn}
        torch.manual_seed(0)
        if family == "bert":
            return transformers.BertModel(transformers.BertConfig(**sizes), add_pooling_layer=False).eval()
        cfg = transformers.LlamaConfig(num_key_value_heads=2, use_cache=False, **sizes)
        return transformers.LlamaForCausalLM(cfg).eval()

    x = torch.randint(0, 64, (2, 8))
    ours, theirs = model(unpadded_sdpa()), model("sdpa")
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=1e-5, atol=1e-5)

    def sdpa_calls(m):
        g = torch.export.export(m, (x,), strict=False).graph
        calls = [n for n in g.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
        assert calls

        def arg(n, i, name):
            return n.args[i] if len(n.args) > i else n.kwargs.get(name)

        return [(arg(n, 3, "attn_mask"), arg(n, 5, "is_causal")) for n in calls]

    assert all(mask is None and bool(causal) == (family == "llama") for mask, causal in sdpa_calls(ours))
    assert all(mask is not None for mask, _ in sdpa_calls(theirs))
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    registered = ALL_MASK_ATTENTION_FUNCTIONS[unpadded_sdpa()]
    assert ALL_MASK_ATTENTION_FUNCTIONS[unpadded_sdpa()] is registered  # registered once
    # a padding mask, a cache (an offset, more keys than queries) or a window gets transformers' own mask
    kw = {"batch_size": 1, "q_length": 4, "kv_length": 4, "device": "cpu", "allow_is_causal_skip": False}
    assert registered(**kw) is None and registered(**{**kw, "kv_length": 6, "kv_offset": 2}) is not None
    padding = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    assert registered(**kw, attention_mask=padding) is not None
    assert registered(**kw, local_size=2) is not None
