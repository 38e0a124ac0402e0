"""The model zoo of tests/frontends/test_torch_zoo.py: models from transformers, timm and torchvision
(tv_models.py's replicas where torchvision does not import beside this PyTorch) at tiny sizes, random
weights, each with its example inputs and, for the trained ones, a target.

`MODELS[name]()` -> `Entry`. A model whose library is absent raises `Missing` (the test skips it).
Language models return logits flattened to [B*S, V] (so that cross_entropy takes [B*S] targets);
every model returns one tensor. Dropout is 0 everywhere (train-mode runs compare exactly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class Missing(Exception):
    """The model's library is not installed (or does not import here)."""


@dataclass
class Entry:
    module: nn.Module
    inputs: tuple[Any, ...]
    target: Any  # for a training step (cross_entropy targets)
    library: str
    family: str


class Logits(nn.Module):
    """A transformers model's `.logits` (language models: flattened to [B*S, V])."""

    def __init__(
        self, model: nn.Module, flatten: bool = False, field: str = "logits", names: tuple[str, ...] = ()
    ) -> None:
        super().__init__()
        self.model = model
        self.flatten = flatten
        self.field = field
        self.names = names  # the inputs passed by keyword (all when given)

    def forward(self, *args: Any) -> Any:
        out = self.model(**dict(zip(self.names, args))) if self.names else self.model(*args)
        out = getattr(out, self.field)
        return out.flatten(0, -2) if self.flatten else out


class TokenLogits(nn.Module):
    """A causal LM's logits from token ids as its one positional argument (torch.export's
    dynamic_shapes and torch.compile's graphs name it), without a KV cache."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


def _transformers() -> Any:
    try:
        import transformers
    except Exception as err:  # noqa: BLE001 - absent or broken
        raise Missing(f"transformers: {err}") from err
    return transformers


def _timm() -> Any:
    try:
        import timm
    except Exception as err:  # noqa: BLE001 - absent, or its torchvision import fails
        raise Missing(f"timm: {err}") from err
    return timm


def _torchvision() -> Any:
    try:
        import torchvision.models as tvm
    except Exception as err:  # noqa: BLE001 - absent, or its C++ ops built for another PyTorch
        raise Missing(f"torchvision: {err}") from err
    return tvm


VOCAB, B, S = 61, 2, 8
_DECODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    use_cache=False,
    attention_dropout=0.0,
)


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, S))


def _lm(config_name: str, model_name: str, **kw: Any) -> Entry:
    tf = _transformers()
    config = getattr(tf, config_name)(**{**_DECODER, **kw})
    model = getattr(tf, model_name)(config)
    return Entry(
        Logits(model, flatten=True), (_tokens(),), torch.randint(0, VOCAB, (B * S,)), "transformers", "decoder LM"
    )


def _classifier(config_name: str, model_name: str, family: str, size: int = 32, channels: int = 3, **kw: Any) -> Entry:
    tf = _transformers()
    config = getattr(tf, config_name)(num_labels=5, **kw)
    model = getattr(tf, model_name)(config)
    return Entry(
        Logits(model), (torch.randn(B, channels, size, size),), torch.randint(0, 5, (B,)), "transformers", family
    )


def llama() -> Entry:
    return _lm("LlamaConfig", "LlamaForCausalLM")


def qwen2() -> Entry:
    return _lm("Qwen2Config", "Qwen2ForCausalLM")


def qwen3() -> Entry:
    return _lm("Qwen3Config", "Qwen3ForCausalLM", head_dim=8)


def mistral() -> Entry:
    return _lm("MistralConfig", "MistralForCausalLM", sliding_window=4)


def gemma() -> Entry:
    return _lm("GemmaConfig", "GemmaForCausalLM", head_dim=8)


def phi3() -> Entry:
    return _lm("Phi3Config", "Phi3ForCausalLM", pad_token_id=0)


def gpt_neox() -> Entry:
    return _lm("GPTNeoXConfig", "GPTNeoXForCausalLM", rotary_pct=0.5, hidden_dropout=0.0)


def gpt2() -> Entry:
    tf = _transformers()
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
    )
    return Entry(
        Logits(tf.GPT2LMHeadModel(config), flatten=True),
        (_tokens(),),
        torch.randint(0, VOCAB, (B * S,)),
        "transformers",
        "decoder LM",
    )


def opt() -> Entry:
    tf = _transformers()
    config = tf.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=32,
        word_embed_proj_dim=32,
        dropout=0.0,
        attention_dropout=0.0,
        use_cache=False,
    )
    return Entry(
        Logits(tf.OPTForCausalLM(config), flatten=True),
        (_tokens(),),
        torch.randint(0, VOCAB, (B * S,)),
        "transformers",
        "decoder LM",
    )


_ENCODER = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    num_labels=5,
)


def bert() -> Entry:
    tf = _transformers()
    model = tf.BertForSequenceClassification(tf.BertConfig(**_ENCODER))
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 5:] = 0
    return Entry(Logits(model), (_tokens(), mask), torch.randint(0, 5, (B,)), "transformers", "encoder")


def roberta() -> Entry:
    tf = _transformers()
    model = tf.RobertaModel(tf.RobertaConfig(**_ENCODER, pad_token_id=1), add_pooling_layer=False)
    return Entry(
        Logits(model, field="last_hidden_state"), (torch.randint(2, VOCAB, (B, S)),), None, "transformers", "encoder"
    )


def distilbert() -> Entry:
    tf = _transformers()
    config = tf.DistilBertConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        max_position_embeddings=32,
        dropout=0.0,
        attention_dropout=0.0,
    )
    return Entry(
        Logits(tf.DistilBertModel(config), field="last_hidden_state"), (_tokens(),), None, "transformers", "encoder"
    )


def t5() -> Entry:
    tf = _transformers()
    config = tf.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        use_cache=False,
        decoder_start_token_id=0,
    )
    model = tf.T5ForConditionalGeneration(config)
    return Entry(
        Logits(model, flatten=True, names=("input_ids", "decoder_input_ids")),
        (_tokens(), _tokens()),
        torch.randint(0, VOCAB, (B * S,)),
        "transformers",
        "encoder-decoder",
    )


def vit() -> Entry:
    return _classifier(
        "ViTConfig",
        "ViTForImageClassification",
        "ViT",
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def deit() -> Entry:
    return _classifier(
        "DeiTConfig",
        "DeiTForImageClassification",
        "ViT",
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def swin() -> Entry:
    return _classifier(
        "SwinConfig",
        "SwinForImageClassification",
        "Swin",
        image_size=32,
        patch_size=4,
        embed_dim=16,
        depths=[2, 1],
        num_heads=[2, 2],
        window_size=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )


def convnext() -> Entry:
    return _classifier(
        "ConvNextConfig",
        "ConvNextForImageClassification",
        "CNN",
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        drop_path_rate=0.0,
    )


def resnet_hf() -> Entry:
    return _classifier(
        "ResNetConfig",
        "ResNetForImageClassification",
        "CNN",
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        downsample_in_first_stage=False,
    )


def mobilevit() -> Entry:
    return _classifier(
        "MobileViTConfig",
        "MobileViTForImageClassification",
        "CNN+ViT",
        size=64,
        image_size=64,
        hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_attention_heads=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )


def mobilenet_v2_hf() -> Entry:
    return _classifier(
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        "CNN",
        size=32,
        image_size=32,
        depth_multiplier=0.35,
        classifier_dropout_prob=0.0,
    )


def _tv(name: str, size: int = 32) -> Entry:
    from .tv_models import build

    model = build(name, num_classes=5)
    library = "torchvision" if type(model).__module__.startswith("torchvision") else "torchvision (replica)"
    return Entry(model, (torch.randn(B, 3, size, size),), torch.randint(0, 5, (B,)), library, "CNN")


def tv_swin_t() -> Entry:
    tvm = _torchvision()
    model = tvm.SwinTransformer(
        patch_size=[4, 4],
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 2],
        window_size=[4, 4],
        stochastic_depth_prob=0.0,
        num_classes=5,
    )
    return Entry(model, (torch.randn(B, 3, 32, 32),), torch.randint(0, 5, (B,)), "torchvision", "Swin")


def tv_vit() -> Entry:
    tvm = _torchvision()
    model = tvm.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64, num_classes=5
    )
    return Entry(model, (torch.randn(B, 3, 32, 32),), torch.randint(0, 5, (B,)), "torchvision", "ViT")


def _timm_model(name: str, family: str, size: int = 32, **kw: Any) -> Entry:
    timm = _timm()
    model = timm.create_model(name, pretrained=False, num_classes=5, **kw)
    return Entry(model, (torch.randn(B, 3, size, size),), torch.randint(0, 5, (B,)), "timm", family)


MODELS: dict[str, Callable[[], Entry]] = {
    "llama": llama,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "mistral": mistral,
    "gemma": gemma,
    "phi3": phi3,
    "gpt_neox": gpt_neox,
    "gpt2": gpt2,
    "opt": opt,
    "bert": bert,
    "roberta": roberta,
    "distilbert": distilbert,
    "t5": t5,
    "vit": vit,
    "deit": deit,
    "swin": swin,
    "convnext": convnext,
    "resnet_hf": resnet_hf,
    "mobilevit": mobilevit,
    "mobilenet_v2_hf": mobilenet_v2_hf,
    "tv_resnet18": lambda: _tv("resnet18"),
    "tv_mobilenet_v3_small": lambda: _tv("mobilenet_v3_small"),
    "tv_swin_t": tv_swin_t,
    "tv_vit": tv_vit,
    "timm_vit_tiny": lambda: _timm_model("vit_tiny_patch16_224", "ViT", img_size=32, patch_size=8, depth=2),
    "timm_convnext_atto": lambda: _timm_model("convnext_atto", "CNN", depths=(1, 1, 1, 1)),
    "timm_resnet18": lambda: _timm_model("resnet18", "CNN"),
    "timm_mobilevit_xxs": lambda: _timm_model("mobilevit_xxs", "CNN+ViT", size=64),
    "timm_swin": lambda: _timm_model(
        "swin_tiny_patch4_window7_224",
        "Swin",
        img_size=32,
        patch_size=2,
        window_size=4,
        depths=(1, 1),
        num_heads=(2, 2),
        embed_dim=16,
    ),
}


def build(name: str) -> Entry:
    """MODELS[name]() with every floating parameter moved off its initial value (zero biases, unit
    norms and zero-initialised heads would hide errors) and random batchnorm statistics."""
    entry = MODELS[name]()
    with torch.no_grad():
        for p in entry.module.parameters():
            if p.dtype.is_floating_point:
                p.add_(torch.randn_like(p) * 0.1)
        for key, b in entry.module.named_buffers():
            if key.endswith("running_mean"):
                b.normal_(0, 0.1)
            elif key.endswith("running_var"):
                b.uniform_(0.5, 1.5)
    return entry


# the models trained one AdamW step (opgraph.training.train_step against torch.optim.AdamW)
TRAINED = ("llama", "qwen2", "gpt2", "bert", "t5", "swin", "vit", "convnext")
