"""Session fixtures: tiny random models and tokenizers built offline in a temp dir."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from tests import process_state
from tests.tiny_models import ENCODER_PAIR_STYLES, build_model, build_tokenizer


class ModelZoo:
    """Builds tiny model directories on demand and keeps them for the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[tuple, Path] = {}

    def get(self, family: str, kind: str, add_bos: bool = False, **overrides) -> Path:
        """A model dir (weights + tokenizer) of a family and kind; cached by arguments."""
        key = (family, kind, add_bos, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in self._dirs:
            name = "-".join(str(k) for k in key[:3]) + "".join(f"-{k}{v}" for k, v in key[3])
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", name)  # dict values (rope_scaling) in a directory name
            path = self.root / name
            tokenizer = build_tokenizer(path, add_bos=add_bos, pair_style=ENCODER_PAIR_STYLES.get(family))
            build_model(path, family, kind, vocab_size=len(tokenizer), **overrides)
            self._dirs[key] = path
        return self._dirs[key]


@pytest.fixture(autouse=True)
def process_settings_kept():
    """Each test leaves the process as it found it: recursion limit, switch interval, the garbage collector,
    signal handlers, environment, working directory, the score_batch logger (tests/process_state.py). One that
    changed any is put back and fails, naming them: a later test would otherwise run in another process."""
    before = process_state.settings()
    yield
    after = process_state.settings()
    process_state.restore(before)
    said = process_state.changed(before, after)
    if said:
        pytest.fail(
            "the test changed process-wide settings (restore them, e.g. with monkeypatch): " + "; ".join(said)
        )


@pytest.fixture
def compiling():
    """For a test that runs torch.compile: what inductor changes for its process (the recursion limit raised to
    2,000, an environment variable) put back before process_settings_kept checks."""
    with process_state.kept():
        yield


@pytest.fixture(scope="session", autouse=True)
def digest_cache(tmp_path_factory) -> Path:
    """Model file digests (job/checkpoint/model_digest) are cached in the session's temp dir, not the user's
    home; the commands the tests start inherit it."""
    path = tmp_path_factory.mktemp("digest-cache")
    os.environ["SCORE_BATCH_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> ModelZoo:
    """The session's tiny-model factory."""
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    return ModelZoo(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def qwen3_causal(zoo) -> Path:
    return zoo.get("qwen3", "causal")


@pytest.fixture(scope="session")
def qwen3_classifier(zoo) -> Path:
    return zoo.get("qwen3", "classifier")


@pytest.fixture(scope="session")
def llama_causal(zoo) -> Path:
    return zoo.get("llama", "causal", add_bos=True)


@pytest.fixture(scope="session")
def llama_classifier(zoo) -> Path:
    return zoo.get("llama", "classifier", add_bos=True)


@pytest.fixture
def copy_model(tmp_path):
    """Copy a model dir into the test's temp dir (to edit it safely)."""

    def _copy(src: Path) -> Path:
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst

    return _copy


@pytest.fixture
def job(qwen3_causal, tmp_path):
    """A 240-row input scored in 40 windows, and its uninterrupted output as the reference."""
    from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
    from tests.test_job import many_rows

    data = write_jsonl(tmp_path / "in.jsonl", many_rows())
    base = [data, "--model", qwen3_causal, *LABEL_FLAGS, "--window-rows", "6", "--max-batch-tokens", "64"]
    reference = tmp_path / "reference.parquet"
    assert run_cli(*base, "-o", reference).returncode == 0
    return base, reference, tmp_path
