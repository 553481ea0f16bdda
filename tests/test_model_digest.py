"""A model's identity by content (job/checkpoint/model_digest.model_identity): cached by each
file's device, inode, size, mtime and ctime, so a file rewritten with its size and time restored is read again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading

import pytest

from score_batch.job.checkpoint import model_digest
from score_batch.job.checkpoint.model_digest import model_identity


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache and an empty memory of digests."""
    monkeypatch.setenv(model_digest.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(model_digest, "_MEMO", {})
    return tmp_path / "cache"


def reads(monkeypatch) -> list:
    """The files model_digest reads from now on."""
    read, original = [], model_digest._read
    monkeypatch.setattr(
        model_digest, "_read", lambda file, stop: read.append(file.name) or original(file, stop)
    )
    return read


def rewrite_in_place(file, data: bytes) -> None:
    """New bytes of the same length in the same inode, with its access and modification times restored."""
    stat = file.stat()
    assert len(data) == stat.st_size
    with open(file, "r+b") as handle:
        handle.write(data)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_second_run_reads_nothing_and_a_rewrite_with_size_and_time_restored_is_read(
    qwen3_causal, tmp_path, cache, monkeypatch
):
    model = tmp_path / "model"
    subprocess.run(["cp", "-rp", str(qwen3_causal), str(model)], check=True)
    read = reads(monkeypatch)
    first = model_identity(model)
    assert "model.safetensors" in read and "config.json" in read and "tokenizer.json" in read
    names = [name for name, _ in first]
    assert names == sorted(names) and all(len(digest) == 64 for _, digest in first)
    assert model_identity(qwen3_causal) == first  # a copy with its times kept: the same model
    monkeypatch.setattr(model_digest, "_MEMO", {})  # a new process: the cache answers
    read.clear()
    assert model_identity(model) == first and read == []

    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(b ^ 1 for b in data[-4:])  # the last weight's lowest bits
    rewrite_in_place(weights, bytes(data))
    changed = model_identity(model)
    assert read == ["model.safetensors"]
    assert dict(changed)["model.safetensors"] != dict(first)["model.safetensors"]
    assert {k: v for k, v in changed if k != "model.safetensors"} == {
        k: v for k, v in first if k != "model.safetensors"
    }


def test_an_unwritable_cache_still_gives_the_digests(qwen3_causal, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a cache below a file cannot be created, as in a read-only home (root included)
    monkeypatch.setenv(model_digest.CACHE_VARIABLE, str(blocked / "cache"))
    monkeypatch.setattr(model_digest, "_MEMO", {})
    first = model_identity(qwen3_causal)
    monkeypatch.setattr(model_digest, "_MEMO", {})
    assert model_identity(qwen3_causal) == first


def test_concurrent_runs_never_read_half_an_entry(qwen3_causal, cache):
    key = model_digest._stat_key(os.stat(qwen3_causal / "model.safetensors"))
    errors = []

    def write_and_read(n: int) -> None:
        for _ in range(200):
            model_digest._store(key, f"{n:064x}")
            found = model_digest._cached(key)
            if found is None or len(found) != 64:
                errors.append(found)

    threads = [threading.Thread(target=write_and_read, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and [p.name for p in (cache / "file-digests").iterdir()] == [
        f"{key[0]}-{key[1]}.json"
    ]


def test_the_identity_covers_weights_loaded_configs_tokenizer_and_module_folders(
    qwen3_causal, tmp_path, cache
):
    model = tmp_path / "model"
    shutil.copytree(qwen3_causal, model)
    base = dict(model_identity(model))
    (model / "pytorch_model.bin").write_bytes(b"unused: the safetensors file is what transformers loads")
    (model / "notes.md").write_text("not read")
    assert dict(model_identity(model)) == base
    (model / "chat_template.jinja").write_text("{{ messages }}")
    (model / "1_LogitScore").mkdir()
    (model / "1_LogitScore" / "config.json").write_text('{"true_token_id": 5}')
    (model / "modules.json").write_text('[{"path": ""}, {"path": "1_LogitScore"}]')
    names = set(dict(model_identity(model)))
    assert names - set(base) == {"chat_template.jinja", "modules.json", "1_LogitScore/config.json"}


def test_the_version_in_every_identity_is_the_checkouts_and_an_older_ones_parts_name_it(tmp_path):
    import re
    from pathlib import Path

    import score_batch
    from score_batch.engine.config import EngineConfig
    from score_batch.io_formats.schema import ColumnOverrides
    from score_batch.job.checkpoint.identity import RunIdentity, software
    from score_batch.job.run_config import RunConfig

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    version = re.search(r'^version = "(.+)"', pyproject, re.M).group(1)
    assert score_batch.__version__ == version == dict(software())["score-batch"]
    config = RunConfig("in.jsonl", "o.parquet", tmp_path, ColumnOverrides(), EngineConfig())
    now = RunIdentity.of(config)
    older = json.loads(json.dumps(now.record))
    older["model"] = [["config.json", "c" * 64], ["model.safetensors", [1234, 5678]]]  # 0.2's identity
    older["software"] = [[n, "0.2.1" if n == "score-batch" else v] for n, v in older["software"]]
    said = now.difference(older)
    assert said == f"score-batch 0.2.1 → {version}"  # not "the model changed": 0.2 identified it otherwise
