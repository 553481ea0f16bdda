"""Testing fixtures, never imported by the runtime: tiny random models and a byte-level BPE tokenizer, built offline."""

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


PAIR_STYLES = ("bert", "roberta")  # [CLS] A [SEP] B [SEP] with token types; <s> A </s></s> B </s>


def build_tokenizer(
    out_dir: str | Path,
    corpus: list[str] | None = None,
    vocab_size: int = 600,
    add_bos: bool = False,
    pair_style: str | None = None,
):
    """Train a byte-level BPE tokenizer on corpus and save it as a PreTrainedTokenizerFast in out_dir.

    pair_style makes an encoder tokenizer whose (query, item) pairs look like BERT's or RoBERTa's.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = (corpus or []) + BASE_CORPUS * 20
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = SPECIAL_TOKENS + (["[CLS]", "[SEP]", "</s>"] if pair_style else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    input_names = ["input_ids", "attention_mask"]
    if pair_style == "bert":
        cls, sep = ("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[cls, sep]
        )
        input_names = ["input_ids", "token_type_ids", "attention_mask"]
    elif pair_style == "roberta":
        bos, eos = ("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[bos, eos]
        )
    elif add_bos:
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
        model_input_names=input_names,
    )
    fast.save_pretrained(out_dir)
    return fast


# family → (model_type, architecture prefix)
FAMILIES = {
    "qwen3": ("qwen3", "Qwen3"),
    "qwen2": ("qwen2", "Qwen2"),
    "llama": ("llama", "Llama"),
    "mistral": ("mistral", "Mistral"),
    "gemma": ("gemma", "Gemma"),
    "gemma2": ("gemma2", "Gemma2"),
    "phi3": ("phi3", "Phi3"),
    "bert": ("bert", "Bert"),
    "xlm-roberta": ("xlm-roberta", "XLMRoberta"),
    "modernbert": ("modernbert", "ModernBert"),
}
ENCODER_PAIR_STYLES = {"bert": "bert", "xlm-roberta": "roberta", "modernbert": "bert"}
# Settings a family needs on top of the shared small sizes (special ids point into the tiny vocabulary).
FAMILY_SETTINGS = {
    "gemma2": {"query_pre_attn_scalar": 16, "sliding_window": 4},
    "phi3": {"bos_token_id": 1, "eos_token_id": 0},
    "bert": {"type_vocab_size": 2},
    "xlm-roberta": {"bos_token_id": 3, "eos_token_id": 6},
    "modernbert": {"cls_token_id": 4, "sep_token_id": 5, "bos_token_id": 4, "eos_token_id": 5},
}


def tiny_config(family: str, kind: str, vocab_size: int, **overrides):
    """A small random config of a model family (see FAMILIES) and kind ('causal' or 'classifier')."""
    from transformers import AutoConfig

    model_type, arch_prefix = FAMILIES[family]
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
    if family in ENCODER_PAIR_STYLES:
        settings = {k: v for k, v in settings.items() if k not in ("head_dim", "num_key_value_heads")}
    if kind == "classifier":
        settings["num_labels"] = 3
    settings.update(FAMILY_SETTINGS.get(family, {}))
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
