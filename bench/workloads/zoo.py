"""Models from the ecosystem (issue 40), random weights, nothing downloaded: transformers'
`LlamaForCausalLM` (8 layers, d 1024, 16 query / 4 key-value heads, SwiGLU 2816, vocab 32000, SDPA
attention) inference at batch 8 x 1024 and training step at batch 4 x 1024, a BERT-base-sized
`BertModel` inference at batch 32 x 512, timm's `vit_base_patch16_224` training step at batch 64 and
`convnext_tiny` inference at batch 64 (224², channels-last).

Inference: bf16 weights and activations, imported with `opgraph.from_torch`, checked against the
float64 module of the same bf16 weights. Training: one AdamW step, bf16 mixed precision (fp32 master
weights), cross-entropy, checked as the GPT-2 step is (`training_gpt2.adamw_step_case`). Peers: eager,
torch.compile (default mode, max-autotune, max-autotune with its CUDA graphs). The inference rows and
the Llama step also run opgraph through `torch.compile(backend="opgraph")` (issue 43), plainly and
with CUDA-graph replay. Floors: the model's FLOPs (nanoGPT's count: 2N + 4 L d T per token forward,
three times that for a step; N the weights a token multiplies, embeddings excluded) at the measured
bf16 GEMM rate; ConvNeXt a per-layer roofline.
"""

from __future__ import annotations

import copy
from typing import Any

from ..case import Case, Ctx, Output
from ..core.floors import Floor, roofline_layers
from ..core.registry import workload
from ..ours import graph_impls, imported_graph
from ..peers.torch_peers import compiled, eager, opgraph_backend
from .networks import layer_records
from .training_gpt2 import adamw_step_case


def _wrap(model: Any, field: str, flatten: bool = False) -> Any:
    from tests.frontends.zoo_models import Logits

    return Logits(model, flatten=flatten, field=field)


UNPADDED_SDPA = "sdpa_unpadded"


def unpadded_sdpa() -> str:
    """transformers' SDPA attention under a name for inputs that are neither padded nor packed, whose mask
    function gives no mask where the mask would only say "causal" or "everything" (no padding mask, as
    many queries as keys from position 0, no sliding window in the config), also while tracing or
    capturing: a causal model's attention is then SDPA's `is_causal`; a cache, an offset or a window gets
    transformers' own mask. transformers' own mask function builds a dense mask under torch.compile (it
    cannot test the padding mask or the position ids for packing while tracing; in 5.17 a CUDA-graph
    capture counts as tracing too), and PyTorch's SDPA leaves its flash and cuDNN kernels for a dense mask
    (BERT's peers took its fp32 math path: 2.3-5x slower, not at their best). The workloads' inputs are
    one sequence a row: every implementation computes the same attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def mask(*args: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        q, kv = kwargs.get("q_length"), kwargs.get("kv_length")
        at_start = all(isinstance(o, int) and o == 0 for o in (kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)))
        window = kwargs.get("local_size") or getattr(kwargs.get("config"), "sliding_window", None)
        if attention_mask is None and at_start and q is not None and q == kv and not window:
            return None
        return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)

    if UNPADDED_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(UNPADDED_SDPA, ALL_ATTENTION_FUNCTIONS["sdpa"])
        AttentionMaskInterface.register(UNPADDED_SDPA, mask)
    return UNPADDED_SDPA


def llama_model(d: int, layers: int, heads: int, kv: int, ffn: int, vocab: int) -> Any:
    """transformers' `LlamaForCausalLM` of these sizes, SDPA attention, seeded random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=ffn,
        max_position_embeddings=2048,
        attn_implementation=unpadded_sdpa(),
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


LLAMA_SIZES = (1024, 8, 16, 4, 2816, 32000)  # d, layers, query heads, key-value heads, SwiGLU width, vocab


def llama_zoo_inference(layers: int = LLAMA_SIZES[1], device: str = "cuda") -> tuple[Any, Any]:
    """The Llama zoo workload's model (bf16, eval, its logits as the output) with `layers` layers on
    `device`, and its token ids (batch 8 x 1024): what the scripts/ checks of that row run."""
    import torch

    d, _, heads, kv, ffn, vocab = LLAMA_SIZES
    model = _wrap(llama_model(d, layers, heads, kv, ffn, vocab).to(device).to(torch.bfloat16).eval(), "logits")
    return model, torch.randint(0, vocab, (8, 1024), device=device)


def llama_zoo_training(layers: int = LLAMA_SIZES[1], device: str = "cuda") -> tuple[Any, Any, Any]:
    """The Llama zoo training row's model (fp32 parameters, train mode, flattened logits as the output) with
    `layers` layers on `device`, its token ids (batch 4 x 1024) and targets: what the scripts/ checks of that
    row run (bench.workloads.training_gpt2.adamw_train_step makes the step)."""
    import torch

    d, _, heads, kv, ffn, vocab = LLAMA_SIZES
    model = _wrap(llama_model(d, layers, heads, kv, ffn, vocab).to(device).train(), "logits", flatten=True)
    x = torch.randint(0, vocab, (4, 1024), device=device)
    return model, x, torch.randint(0, vocab, (4 * 1024,), device=device)


def _llama(ctx: Ctx) -> tuple[Any, dict[str, int]]:
    d, layers, heads, kv, ffn, vocab = ctx.pick(LLAMA_SIZES, None, (32, 2, 4, 2, 64, 128))
    return llama_model(d, layers, heads, kv, ffn, vocab), {"d": d, "layers": layers, "vocab": vocab}


def _bert(ctx: Ctx) -> tuple[Any, dict[str, int]]:
    import torch
    from transformers import BertConfig, BertModel

    d, layers, heads, ffn, vocab = ctx.pick((768, 12, 12, 3072, 30522), None, (32, 2, 4, 64, 128))
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=d,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        attn_implementation=unpadded_sdpa(),
    )
    torch.manual_seed(0)
    return BertModel(cfg, add_pooling_layer=False), {"d": d, "layers": layers, "vocab": vocab}


def _token_flops(model: Any, dims: dict[str, int], seq: int, embeddings: tuple[str, ...]) -> float:
    """Forward FLOPs per token: 2N + 4 L d T (N without the embedding tables named)."""
    n = sum(p.numel() for name, p in model.named_parameters() if not name.endswith(embeddings))
    return 2 * n + 4 * dims["layers"] * dims["d"] * seq


def _inference_case(ctx: Ctx, module: Any, args: tuple[Any, ...], floor: Floor, notes: str) -> Case:
    """bf16 inference of `module(*args)` (one output): opgraph's builds, eager and torch.compile."""
    import torch

    with torch.no_grad():  # float64, from the same bf16 weights and inputs the implementations get
        want = copy.deepcopy(module).double()(*(a.double() if a.is_floating_point() else a for a in args))
    impls = graph_impls(ctx, imported_graph(module, args), tune=ctx.tune and ctx.tune_networks)
    if ctx.scale == "tiny":  # generated kernels of a whole model under Triton's interpreter: too slow
        impls = [i for i in impls if not i.name.startswith("generated")]
    impls += [eager(module, args)]
    impls += opgraph_backend(module, args, cudagraphs=ctx.compile_cudagraphs)  # (before max-autotune's minutes)
    impls += compiled(module, args, inference=True, freezing=True, cudagraphs=ctx.compile_cudagraphs, default=True)
    notes += "; tuned opgraph plans " + ("included" if ctx.tune_networks else "not built (--tune-networks)")
    return Case([Output("out", "bfloat16")], lambda: [want], impls, floor, notes=notes)


def _token_inference(
    ctx: Ctx, model: Any, dims: dict[str, int], shape: tuple[int, int], field: str, embeddings: str, notes: str
) -> Case:
    """bf16 inference of a transformers model on random token ids of `shape`, its output `field`."""
    import torch

    batch, seq = shape
    module = _wrap(model.to(ctx.device).to(torch.bfloat16).eval(), field)
    x = torch.randint(0, dims["vocab"], (batch, seq), device=ctx.device)
    flops = _token_flops(model, dims, seq, (embeddings,)) * batch * seq
    return _inference_case(ctx, module, (x,), Floor(flops=flops, dtype="bfloat16", tflops=True), notes)


@workload(
    "zoo.llama.infer.b8",
    group="zoo-llama-infer",
    kind="network",
    quick=False,
    needs={"transformers"},
    minutes=3.0,
    title="Llama (8 layers, d 1024, GQA 16/4) inference, batch 8 × 1024, bf16",
)
def llama_inference(ctx: Ctx) -> Case:
    model, dims = _llama(ctx)
    shape = ctx.pick((8, 1024), None, (2, 16))
    notes = "LlamaForCausalLM, bf16 weights; output: the logits"
    return _token_inference(ctx, model, dims, shape, "logits", "embed_tokens.weight", notes)


@workload(
    "zoo.bert.infer.b32",
    group="zoo-bert-infer",
    kind="network",
    quick=False,
    needs={"transformers"},
    minutes=3.0,
    title="BERT-base inference, batch 32 × 512, bf16",
)
def bert_inference(ctx: Ctx) -> Case:
    model, dims = _bert(ctx)
    shape = ctx.pick((32, 512), None, (2, 16))
    notes = (
        "BertModel (no pooler), bf16; output: the last hidden state. No padding: every implementation runs "
        "transformers' SDPA attention with no mask (zoo.unpadded_sdpa: transformers' own mask function gives "
        "a dense all-true mask under torch.compile, in 5.17 under CUDA-graph capture too, and SDPA's fp32 math "
        "path for it)"
    )
    return _token_inference(ctx, model, dims, shape, "last_hidden_state", "_embeddings.weight", notes)


@workload(
    "zoo.convnext.infer.b64",
    group="zoo-convnext-infer",
    kind="network",
    quick=False,
    needs={"timm"},
    minutes=3.0,
    title="timm ConvNeXt-T inference, batch 64, 224², bf16 channels-last",
)
def convnext_inference(ctx: Ctx) -> Case:
    import timm
    import torch

    res, batch = ctx.pick((224, 64), None, (32, 2))
    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny", pretrained=False).to(ctx.device).eval()
    model = model.to(memory_format=torch.channels_last)
    x32 = torch.randn(batch, 3, res, res, device=ctx.device).to(memory_format=torch.channels_last)
    floor = Floor(layers=roofline_layers(layer_records(model, x32)))
    module = model.to(torch.bfloat16)
    notes = f"timm {timm.__version__} convnext_tiny, bf16 channels-last; output: the logits"
    return _inference_case(ctx, module, (x32.to(torch.bfloat16),), floor, notes)


@workload(
    "zoo.llama.train.b4",
    group="zoo-llama-train",
    kind="training",
    quick=False,
    needs={"transformers"},
    minutes=4.0,
    title="Llama (8 layers, d 1024, GQA 16/4) training step, batch 4 × 1024, bf16 mixed precision, AdamW",
)
def llama_training(ctx: Ctx) -> Case:
    import torch

    model, dims = _llama(ctx)
    batch, seq = ctx.pick((4, 1024), None, (2, 16))
    model = _wrap(model.to(ctx.device).train(), "logits", flatten=True)
    x = torch.randint(0, dims["vocab"], (batch, seq), device=ctx.device)
    y = torch.randint(0, dims["vocab"], (batch * seq,), device=ctx.device)
    flops = 3 * _token_flops(model, dims, seq, ("embed_tokens.weight",)) * batch * seq
    v = {"model": model, "x": x, "y": y, "label": "Llama training step"}
    notes = "LlamaForCausalLM; floor and TFLOP/s: 6N + 12 L d T flops per token"
    return adamw_step_case(ctx, v, flops, notes, backend_rows=True)


@workload(
    "zoo.vit.train.b64",
    group="zoo-vit-train",
    kind="training",
    quick=False,
    needs={"timm"},
    minutes=4.0,
    title="timm ViT-B/16 training step, batch 64, 224², bf16 mixed precision, AdamW",
)
def vit_training(ctx: Ctx) -> Case:
    import timm
    import torch

    batch = ctx.pick(64, None, 2)
    kw = ctx.pick({}, None, {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2})
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, **kw).to(ctx.device).train()
    res = kw.get("img_size", 224)
    tokens = (res // kw.get("patch_size", 16)) ** 2 + 1
    x = torch.randn(batch, 3, res, res, device=ctx.device)
    y = torch.randint(0, 1000, (batch,), device=ctx.device)
    dims = {"layers": len(model.blocks), "d": model.embed_dim}
    flops = 3 * _token_flops(model, dims, tokens, ()) * batch * tokens
    v = {"model": model, "x": x, "y": y, "label": "ViT-B/16 training step"}
    notes = f"timm {timm.__version__} vit_base_patch16_224; floor and TFLOP/s: 6N + 12 L d T flops per token"
    return adamw_step_case(ctx, v, flops, notes)
