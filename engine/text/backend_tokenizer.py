"""A model directory's tokenizer.json run by the tokenizers library alone (no transformers import), where
transformers would load that file unchanged; transformers' own tokenizer is built the first time anything
else is asked of it (its __call__, chat templates, …), so every answer is transformers'.

Eligible: tokenizer_config.json names the generic class (TokenizersBackend or PreTrainedTokenizerFast), sets
nothing but the keys in SETTINGS, and every special or added token it names is already an added token of
tokenizer.json with the same flags, whose post-processor is set (transformers then adds, rebuilds and patches
nothing). Model-specific classes (Qwen2Tokenizer, LlamaTokenizer, …) rebuild their pipeline in
transformers and are loaded there. tests/test_backend_tokenizer.py checks token ids against transformers'.
"""

from __future__ import annotations

from pathlib import Path

from score_batch.engine.activation import json_object

GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
SETTINGS = {
    *SPECIAL_TOKENS,
    "backend",
    "tokenizer_class",
    "model_max_length",
    "clean_up_tokenization_spaces",
    "added_tokens_decoder",
    "split_special_tokens",
    "chat_template",
    "model_input_names",  # these three shape padded or truncated batches, which transformers' __call__ makes
    "padding_side",
    "truncation_side",
}
OTHER_FILES = ("special_tokens_map.json", "added_tokens.json", "tokenizer.model", "vocab.json", "vocab.txt")
VERY_LARGE_INTEGER = int(1e30)  # transformers' model_max_length when none is saved
ADDED_TOKEN_FLAGS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


class BackendTokenizer:
    """The answers a run asks of a fast tokenizer, from its tokenizers backend; the rest from transformers'."""

    is_fast = True

    def __init__(self, path: Path, backend, settings: dict, trust_remote_code: bool) -> None:
        self._path = path
        self._backend = backend  # tokenizers.Tokenizer, no truncation or padding (as a run's calls set it)
        self._trust_remote_code = trust_remote_code
        self._transformers = None
        self.split_special_tokens = bool(settings.get("split_special_tokens", False))
        self._backend.encode_special_tokens = self.split_special_tokens
        self.model_max_length = settings.get("model_max_length", VERY_LARGE_INTEGER)
        self._special = {name: _content(settings.get(name)) for name in SPECIAL_TOKENS}

    def __len__(self) -> int:
        """The vocabulary with its added tokens."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __getattr__(self, name: str):
        """Anything else: transformers' tokenizer of the directory (loaded once, on first use)."""
        if name.startswith("__") or name in ("_transformers", "_path", "_backend", "_trust_remote_code"):
            raise AttributeError(name)
        return getattr(self.transformers_tokenizer(), name)

    def __call__(self, *args, **kwargs):
        """transformers' __call__, as its own tokenizer answers it."""
        return self.transformers_tokenizer()(*args, **kwargs)

    def transformers_tokenizer(self):
        """transformers' tokenizer of the same directory (AutoTokenizer), loaded on first use."""
        if self._transformers is None:
            from transformers import AutoTokenizer

            self._transformers = AutoTokenizer.from_pretrained(
                self._path, local_files_only=True, trust_remote_code=self._trust_remote_code
            )
        return self._transformers

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list:
        """tokenizers Encodings of texts, as transformers' __call__ encodes them (no truncation or padding)."""
        return self._backend.encode_batch(texts, add_special_tokens=add_special_tokens, is_pretokenized=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | None | list[int | None]:
        """A token's id (the unknown token's for one outside the vocabulary), or each of a list's."""
        if isinstance(tokens, str):
            found = self._backend.token_to_id(tokens)
            return found if found is not None else self.unk_token_id
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def _special_id(self, name: str) -> int | None:
        token = self._special[name]
        if token is None:
            return None
        if name == "unk_token":  # the unknown token's own id: never the fallback to it
            return self._backend.token_to_id(token)
        return self.convert_tokens_to_ids(token)

    pad_token_id = property(
        lambda self: self._special_id("pad_token"), doc="The padding token's id, or None."
    )
    eos_token_id = property(lambda self: self._special_id("eos_token"), doc="The end token's id, or None.")
    bos_token_id = property(lambda self: self._special_id("bos_token"), doc="The start token's id, or None.")
    unk_token_id = property(
        lambda self: self._special_id("unk_token"), doc="The unknown token's id, or None."
    )


def backend_tokenizer(path: Path, trust_remote_code: bool) -> BackendTokenizer | None:
    """The directory's BackendTokenizer, or None where transformers must load it (see the module's doc)."""
    settings = json_object(path / "tokenizer_config.json")  # {}: transformers' load says why
    if (
        settings.get("tokenizer_class") not in GENERIC_CLASSES
        or not set(settings) <= SETTINGS
        or not (path / "tokenizer.json").is_file()
        or any((path / name).exists() for name in OTHER_FILES)
    ):
        return None
    from tokenizers import Tokenizer

    try:
        backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # transformers names a damaged file (load_tokenizer)
        return None
    if backend.post_processor is None or not _tokens_match(backend, settings):
        return None
    backend.no_truncation()
    backend.no_padding()
    return BackendTokenizer(path, backend, settings, trust_remote_code)


def _tokens_match(backend, settings: dict) -> bool:
    """Whether every token the settings name is an added token of the backend already (flags and all)."""
    added = backend.get_added_tokens_decoder()  # {id: AddedToken}
    by_content = {token.content: token for token in added.values()}
    for key, entry in (settings.get("added_tokens_decoder") or {}).items():
        token = added.get(int(key)) if str(key).isdigit() else None
        if not isinstance(entry, dict) or token is None:
            return False
        if any(entry.get(flag) != getattr(token, flag) for flag in ADDED_TOKEN_FLAGS if flag in entry):
            return False
    for name in SPECIAL_TOKENS:
        content = _content(settings.get(name))
        if content is not None and (content not in by_content or not by_content[content].special):
            return False
    return True


def _content(value) -> str | None:
    """A special token's text: a string, or an AddedToken's saved dict's content."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
