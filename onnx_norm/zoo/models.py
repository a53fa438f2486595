"""Tiny Hugging Face models built from config objects with random weights (nothing is downloaded).

Each `ZooModel` says how to build one model family at a size that exports in seconds, what inputs it takes,
and which ONNX Runtime transformers-optimizer `model_type` fits it (for the coverage comparison).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Literal

import numpy as np

from onnx_norm.zoo.compat import tolerate_cuda_torchvision

InputKind = Literal["text", "seq2seq", "vision", "speech"]

VOCAB = 128
HIDDEN = 64
HEADS = 4
FFN = 128
LAYERS = 2
IMAGE = 32
MEL_BINS = 16
AUDIO_POSITIONS = 16  # Whisper needs exactly 2 * max_source_positions feature frames


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model family at toy size."""

    name: str
    config_class: str  # attribute of `transformers`
    config: dict[str, Any]
    inputs: InputKind = "text"
    model_class: str = "AutoModel"
    ort_model_type: str = "bert"  # onnxruntime.transformers.optimizer model_type
    note: str = ""  # why the model is in the zoo, or what is special about it

    def fingerprint(self) -> str:
        """A short hash of everything that decides the exported graph, for cache keys."""
        payload = json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _encoder(**extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        "max_position_embeddings": 64,
        **extra,
    }


def _decoder(**extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": 2,
        "intermediate_size": FFN,
        "max_position_embeddings": 64,
        **extra,
    }


def _seq2seq(**extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "d_model": HIDDEN,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": HEADS,
        "decoder_attention_heads": HEADS,
        "encoder_ffn_dim": FFN,
        "decoder_ffn_dim": FFN,
        "max_position_embeddings": 64,
        **extra,
    }


def _t5(**extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB,
        "d_model": HIDDEN,
        "d_kv": HIDDEN // HEADS,
        "d_ff": FFN,
        "num_layers": 1,
        "num_decoder_layers": 1,
        "num_heads": HEADS,
        "decoder_start_token_id": 0,
        **extra,
    }


_MODELS = [
    # Encoders: post-norm LayerNorm with bias (nn.LayerNorm), residual Add before each norm.
    ZooModel("bert", "BertConfig", _encoder()),
    ZooModel("roberta", "RobertaConfig", _encoder(pad_token_id=1)),
    ZooModel("xlm-roberta", "XLMRobertaConfig", _encoder(pad_token_id=1)),
    ZooModel("electra", "ElectraConfig", _encoder(embedding_size=32)),
    ZooModel(
        "distilbert",
        "DistilBertConfig",
        {
            "vocab_size": VOCAB,
            "dim": HIDDEN,
            "n_layers": LAYERS,
            "n_heads": HEADS,
            "hidden_dim": FFN,
            "max_position_embeddings": 64,
        },
    ),
    ZooModel("albert", "AlbertConfig", _encoder(embedding_size=32), note="one shared layer run twice"),
    ZooModel("deberta-v2", "DebertaV2Config", _encoder(max_relative_positions=16, position_buckets=8)),
    ZooModel(
        "modernbert",
        "ModernBertConfig",
        _encoder(
            global_attn_every_n_layers=2,
            local_attention=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        ),
        note="LayerNorm without bias",
    ),
    # Decoders with LayerNorm.
    ZooModel(
        "gpt2",
        "GPT2Config",
        {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "n_positions": 64},
        ort_model_type="gpt2",
    ),
    ZooModel(
        "gpt-neo",
        "GPTNeoConfig",
        {
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "num_layers": LAYERS,
            "num_heads": HEADS,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 16,
            "max_position_embeddings": 64,
        },
        ort_model_type="gpt2",
    ),
    ZooModel("gpt-neox", "GPTNeoXConfig", _encoder(), ort_model_type="gpt_neox"),
    ZooModel(
        "gptj",
        "GPTJConfig",
        {"vocab_size": VOCAB, "n_embd": HIDDEN, "n_layer": LAYERS, "n_head": HEADS, "rotary_dim": 8, "n_positions": 64},
        ort_model_type="gpt2",
    ),
    ZooModel(
        "opt",
        "OPTConfig",
        {
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "ffn_dim": FFN,
            "word_embed_proj_dim": HIDDEN,
            "max_position_embeddings": 64,
        },
        ort_model_type="gpt2",
    ),
    ZooModel(
        "bloom",
        "BloomConfig",
        {"vocab_size": VOCAB, "hidden_size": HIDDEN, "n_layer": LAYERS, "n_head": HEADS},
        ort_model_type="gpt2",
    ),
    ZooModel(
        "falcon",
        "FalconConfig",
        {
            "vocab_size": VOCAB,
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "new_decoder_architecture": True,
            "num_kv_heads": 2,
            "max_position_embeddings": 64,
        },
        ort_model_type="gpt2",
    ),
    ZooModel("phi", "PhiConfig", _decoder(), ort_model_type="phi"),
    ZooModel("stablelm", "StableLmConfig", _decoder(), ort_model_type="gpt2"),
    ZooModel("olmo", "OlmoConfig", _decoder(), ort_model_type="gpt2", note="LayerNorm without scale or bias"),
    ZooModel("cohere", "CohereConfig", _decoder(), ort_model_type="gpt2", note="hand-written LayerNorm, no bias"),
    # Decoders with RMSNorm.
    ZooModel("llama", "LlamaConfig", _decoder(), ort_model_type="gpt2"),
    ZooModel("mistral", "MistralConfig", _decoder(), ort_model_type="gpt2"),
    ZooModel("qwen2", "Qwen2Config", _decoder(), ort_model_type="gpt2"),
    ZooModel("qwen3", "Qwen3Config", _decoder(head_dim=16), ort_model_type="gpt2", note="q/k RMSNorm over head_dim"),
    ZooModel("phi3", "Phi3Config", _decoder(pad_token_id=0, bos_token_id=1, eos_token_id=2), ort_model_type="gpt2"),
    ZooModel("gemma", "GemmaConfig", _decoder(head_dim=16), ort_model_type="gpt2", note="scale is (1 + w)"),
    ZooModel(
        "gemma2",
        "Gemma2Config",
        _decoder(head_dim=16, sliding_window=16),
        ort_model_type="gpt2",
        note="four norms per layer, (1 + w)",
    ),
    ZooModel(
        "gemma3",
        "Gemma3TextConfig",
        _decoder(head_dim=16, sliding_window=16),
        model_class="Gemma3TextModel",
        ort_model_type="gpt2",
        note="q/k norms, (1 + w)",
    ),
    ZooModel("olmo2", "Olmo2Config", _decoder(), ort_model_type="gpt2", note="q/k RMSNorm over the whole projection"),
    ZooModel("granite", "GraniteConfig", _decoder(), ort_model_type="gpt2"),
    ZooModel("starcoder2", "Starcoder2Config", _decoder(), ort_model_type="gpt2", note="LayerNorm with bias"),
    # Encoder-decoders.
    ZooModel("t5", "T5Config", _t5(), inputs="seq2seq", ort_model_type="t5", note="T5LayerNorm: RMS, no mean"),
    ZooModel("mt5", "MT5Config", _t5(), inputs="seq2seq", ort_model_type="t5"),
    ZooModel("bart", "BartConfig", _seq2seq(), inputs="seq2seq", ort_model_type="bart"),
    ZooModel(
        "marian",
        "MarianConfig",
        _seq2seq(pad_token_id=0, decoder_start_token_id=0),
        inputs="seq2seq",
        ort_model_type="bart",
    ),
    ZooModel(
        "whisper",
        "WhisperConfig",
        _seq2seq(
            num_mel_bins=MEL_BINS,
            max_source_positions=AUDIO_POSITIONS,
            max_target_positions=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            suppress_tokens=[],
            begin_suppress_tokens=[],
        ),
        inputs="speech",
        ort_model_type="bart",
    ),
    # Vision.
    ZooModel(
        "vit",
        "ViTConfig",
        {
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "intermediate_size": FFN,
            "image_size": IMAGE,
            "patch_size": 8,
        },
        inputs="vision",
        ort_model_type="vit",
    ),
    ZooModel(
        "dinov2",
        "Dinov2Config",
        {
            "hidden_size": HIDDEN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS,
            "mlp_ratio": 2,
            "image_size": IMAGE,
            "patch_size": 8,
        },
        inputs="vision",
        ort_model_type="vit",
    ),
    ZooModel(
        "swin",
        "SwinConfig",
        {
            "image_size": IMAGE,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 4],
            "window_size": 4,
        },
        inputs="vision",
        ort_model_type="swin",
    ),
    ZooModel(
        "convnext",
        "ConvNextConfig",
        {"num_stages": 2, "hidden_sizes": [16, 32], "depths": [1, 1], "image_size": IMAGE},
        inputs="vision",
        ort_model_type="vit",
        note="channels-first LayerNorm: transposed around F.layer_norm in transformers 5",
    ),
]

# Not in the zoo: Mixtral (and the other MoE decoders that route with torch.histc): the TorchScript exporter has
# no symbolic for aten::histc and the dynamo exporter fails converting the routing; no norm pattern is lost, as
# their norms are Mistral's.

ZOO: dict[str, ZooModel] = {model.name: model for model in _MODELS}

# The subset the tests run by default: one of each norm shape the rewrite must handle
# (post-norm LN with residual, pre-norm LN, RMSNorm with Casts, (1 + w) scales, T5, channels-first, enc-dec).
DEFAULT_SUBSET = ("bert", "gpt2", "llama", "qwen3", "gemma2", "t5", "convnext", "whisper")


def build_model(spec: ZooModel, seed: int = 0) -> Any:
    """The torch model for `spec` in eval mode, eager attention, float32, weights drawn from `seed`."""
    import torch

    tolerate_cuda_torchvision()
    import transformers

    config = getattr(transformers, spec.config_class)(**spec.config)
    torch.manual_seed(seed)
    cls = getattr(transformers, spec.model_class)
    # Auto classes build from a config with from_config, concrete model classes with _from_config.
    factory = getattr(cls, "from_config", None) or cls._from_config
    model = factory(config, attn_implementation="eager")
    _randomize_norm_parameters(model, seed)
    return model.eval()


def _randomize_norm_parameters(model: Any, seed: int) -> None:
    """Norm weights start at exactly 1 (or 0 for Gemma's 1 + w) and biases at 0, which would hide a swapped or
    dropped scale; draw them near their initial value instead."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if not is_norm_module(module):
                continue
            for name, param in module.named_parameters(recurse=False):
                noise = torch.randn(param.shape, generator=generator) * 0.1
                param.add_(noise.to(param.dtype))
                del name


def is_norm_module(module: Any) -> bool:
    """LayerNorm and RMSNorm modules: torch's own and each model's hand-written ones (LlamaRMSNorm, T5LayerNorm,
    ConvNextLayerNorm, CohereLayerNorm, ...). Group and batch norms are not in scope."""
    import torch

    if isinstance(module, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
        return True
    name = type(module).__name__
    return name.endswith(("RMSNorm", "LayerNorm", "RmsNorm"))


def example_inputs(
    spec: ZooModel, batch: int, seq: int, seed: int, float_dtype: Any = np.float32
) -> dict[str, np.ndarray]:
    """Seeded inputs for `spec`: token ids inside the vocabulary with a partly padded attention mask for text,
    normal pixels or mel features for vision and speech. `seq` is ignored where the model fixes the length."""
    rng = np.random.default_rng(seed)
    # Ids below the config's vocabulary, which a caller may have made smaller than the zoo's (bench_models --vocab).
    vocab = min(VOCAB, int(spec.config.get("vocab_size", VOCAB)))
    if vocab < 3:
        raise ValueError(f"{spec.name}: vocab_size {vocab} leaves no token ids above the 2 special ones")
    if spec.inputs in ("text", "seq2seq"):
        ids = rng.integers(2, vocab, size=(batch, seq), dtype=np.int64)
        mask = np.ones((batch, seq), dtype=np.int64)
        mask[0, seq - 2 :] = 0  # right padding on one row, so masking paths are exercised
        inputs = {"input_ids": ids, "attention_mask": mask}
        if spec.inputs == "seq2seq":
            inputs["decoder_input_ids"] = rng.integers(2, vocab, size=(batch, max(1, seq - 3)), dtype=np.int64)
        return inputs
    if spec.inputs == "vision":
        return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(float_dtype)}
    features = rng.standard_normal((batch, MEL_BINS, 2 * AUDIO_POSITIONS)).astype(float_dtype)
    # An explicit decoder mask: without one, transformers looks for packed sequences with torch.diff, which the
    # TorchScript exporter cannot export.
    return {
        "input_features": features,
        "decoder_input_ids": rng.integers(2, vocab, size=(batch, seq), dtype=np.int64),
        "decoder_attention_mask": np.ones((batch, seq), dtype=np.int64),
    }


def dynamic_axes(spec: ZooModel) -> dict[str, dict[int, str]]:
    """Batch and sequence are dynamic; image size and mel-frame count are fixed by the architecture."""
    if spec.inputs == "vision":
        return {"pixel_values": {0: "batch"}}
    if spec.inputs == "speech":
        decoder = {0: "batch", 1: "decoder_sequence"}
        return {"input_features": {0: "batch"}, "decoder_input_ids": decoder, "decoder_attention_mask": decoder}
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    if spec.inputs == "seq2seq":
        axes["decoder_input_ids"] = {0: "batch", 1: "decoder_sequence"}
    return axes
