"""Frozen engine and scoring settings, resolved once by the caller (the CLI or Python code)."""

from __future__ import annotations

from dataclasses import dataclass, field

PACKING_MODES = ("auto", "mis", "single")
BACKENDS = ("auto", "sdpa", "split", "flex", "flashinfer")
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
TRUNCATE_POLICIES = ("error", "item-tail", "query-head")
SGLANG_DEFAULT_DELIMITER = 9999


@dataclass(frozen=True)
class ScoringConfig:
    """What a score is: labels, templates, packing, truncation (SEMANTICS §1–§5)."""

    label_tokens: tuple[str, ...] = ()
    label_token_ids: tuple[int, ...] = ()
    apply_softmax: bool = False
    score_index: int = -1
    pooled_hidden_states: bool = False
    normalize: bool = False
    query_template: str | None = None
    item_template: str | None = None
    item_first: bool = False
    packing: str = "auto"  # auto: mis when the model allows it, else single
    delimiter_token_id: int | None = None
    max_query_tokens: int | None = None
    max_item_tokens: int | None = None
    truncate: str = "error"

    def __post_init__(self) -> None:
        _check_choice("packing", self.packing, PACKING_MODES)
        _check_choice("truncate", self.truncate, TRUNCATE_POLICIES)
        if self.label_tokens and self.label_token_ids:
            raise ValueError("give label tokens as strings or as ids, not both")
        for name in ("query_template", "item_template"):
            template = getattr(self, name)
            placeholder = "{query}" if name == "query_template" else "{item}"
            if template is not None and placeholder not in template:
                raise ValueError(f"{name} {template!r} must contain {placeholder}")
        for name in ("max_query_tokens", "max_item_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")


@dataclass(frozen=True)
class EngineConfig:
    """How to run: device, dtype, attention backend and token budgets."""

    device: str = "auto"
    dtype: str = "auto"
    backend: str = "auto"
    max_batch_tokens: int | None = None
    max_pack_tokens: int = 8192
    compile: bool | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    scoring: ScoringConfig = field(default_factory=ScoringConfig)

    def __post_init__(self) -> None:
        _check_choice("device", self.device, DEVICES)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("backend", self.backend, BACKENDS)
        if self.max_pack_tokens < 8:
            raise ValueError(f"max_pack_tokens must be at least 8, got {self.max_pack_tokens}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ValueError naming the setting when value is not one of choices."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
