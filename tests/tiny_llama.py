"""A tiny random LLaMA checkpoint with a word-level tokenizer, saved locally (nothing is downloaded)."""

from __future__ import annotations

from pathlib import Path

VOCAB = 96  # not the MLP width: GenAI's builder takes any Linear with vocab_size outputs for the LM head
PROMPT = [1, 5, 9, 17, 33]


def save_tiny_llama(directory: Path) -> None:
    import tokenizers
    import torch
    import transformers

    from onnx_norm.zoo import ZOO

    torch.manual_seed(0)
    # The zoo's toy LLaMA (the size every test exports), with the vocabulary and token ids of the tokenizer below.
    spec = ZOO["llama"]
    tokens = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config = getattr(transformers, spec.config_class)(**{**spec.config, "vocab_size": VOCAB, **tokens})
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<unk>"
    )
    fast.save_pretrained(directory)
