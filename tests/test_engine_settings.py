"""The engine speaks its own API: setting errors name Owner.field=value, and no message names a CLI flag."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from score_batch.engine.config import EngineConfig, ScoringConfig
from score_batch.engine.errors import SettingError

STRING_TOKENS = {
    tokenize.STRING,
    getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING),
}  # 3.12 splits f-strings
ENGINE = Path(__file__).resolve().parents[1] / "engine"


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: ScoringConfig(packing="pairs"),
            "ScoringConfig.packing='pairs' is not one of auto, mis, single",
        ),
        (lambda: ScoringConfig(truncate="middle"), "ScoringConfig.truncate='middle' is not one of"),
        (lambda: ScoringConfig(query_template="x"), "ScoringConfig.query_template='x' must contain {query}"),
        (lambda: ScoringConfig(max_item_tokens=0), "ScoringConfig.max_item_tokens=0 must be at least 1"),
        (
            lambda: ScoringConfig(label_tokens=("a",), label_token_ids=(1,)),
            "ScoringConfig.label_token_ids=(1,)",
        ),
        (lambda: EngineConfig(backend="fast"), "EngineConfig.backend='fast' is not one of auto, flashinfer"),
        (lambda: EngineConfig(dtype="fp4"), "EngineConfig.dtype='fp4'"),
        (lambda: EngineConfig(device="tpu"), "EngineConfig.device='tpu'"),
        (lambda: EngineConfig(max_pack_tokens=4), "EngineConfig.max_pack_tokens=4 must be at least 8"),
        (lambda: EngineConfig(max_batch_tokens=0), "EngineConfig.max_batch_tokens=0 must be positive"),
    ],
)
def test_invalid_settings_name_the_field_and_value(build, message):
    with pytest.raises(SettingError) as error:
        build()
    assert str(error.value).startswith(message)


def test_no_engine_string_names_a_cli_flag():
    flags = []
    for path in sorted(ENGINE.rglob("*.py")):
        source = path.read_text()
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in STRING_TOKENS and re.search(r"--[a-z]", token.string):
                flags.append(f"{path.name}:{token.start[0]}: {token.string}")
    assert not flags, flags
