"""Tiny random models and a small byte-level BPE tokenizer, built offline (tests, benchmarks, demo)."""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
BASE_CORPUS = [
    "I pledge allegiance to the flag of the United States of America",
    "Tokyo is a city in Japan and the capital of the country",
    "the quick brown fox jumps over the lazy dog to get to the other side",
    "yes no yes no maybe yes no",
    "What is the capital of California? Answer yes or no for each option",
    "Sacramento San Jose San Francisco Los Angeles",
    "wireless noise cancelling headphones with long battery life",
    "red running shoes for women, lightweight and breathable",
]


def build_tokenizer(
    out_dir: str | Path, corpus: list[str] | None = None, vocab_size: int = 600, add_bos: bool = False
):
    """Train a byte-level BPE tokenizer on corpus and save it as a PreTrainedTokenizerFast in out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = (corpus or []) + BASE_CORPUS * 20
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    if add_bos:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", bos_id)]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        bos_token="<s>" if add_bos else None,
    )
    fast.save_pretrained(out_dir)
    return fast


def tiny_config(family: str, kind: str, vocab_size: int, **overrides):
    """A small random config of a model family ('qwen3', 'qwen2', 'llama', 'mistral') and kind."""
    from transformers import AutoConfig

    model_type = {"qwen3": "qwen3", "qwen2": "qwen2", "llama": "llama", "mistral": "mistral"}[family]
    arch_prefix = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama", "mistral": "Mistral"}[family]
    suffix = "ForCausalLM" if kind == "causal" else "ForSequenceClassification"
    settings = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        architectures=[arch_prefix + suffix],
        pad_token_id=0,
    )
    if kind == "classifier":
        settings["num_labels"] = 3
    settings.update(overrides)
    return AutoConfig.for_model(model_type, **settings)


def build_model(
    out_dir: str | Path, family: str, kind: str, vocab_size: int, seed: int = 0, **overrides
) -> Path:
    """Create a tiny random model of a family and kind and save it (safetensors) to out_dir."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config = tiny_config(family, kind, vocab_size, **overrides)
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
    model = auto.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Random init keeps most logits near zero; widen them so scores differ visibly between items.
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.15)
    model.save_pretrained(out_dir, safe_serialization=True)
    return Path(out_dir)
