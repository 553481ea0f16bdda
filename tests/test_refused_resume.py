"""A refused --resume leaves the checkpoint as it found it: one test per refusal reason (input, flag, model,
version), each checking the parts directory byte for byte and that the original --resume then finishes with the
uninterrupted run's output."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.test_cli import LABEL_FLAGS, run_cli, write_jsonl
from tests.test_job import many_rows

pytestmark = pytest.mark.slow


def stopped_after(parts: int, monkeypatch, *args) -> None:
    """Run the command in-process and stop it (SIGTERM) once it has checkpointed `parts` parts (--no-pipeline:
    parts written in turn on the main thread, so none is written after the stop; not in the run's identity)."""
    from score_batch.job.checkpoint.parts import PartStore

    original, written = PartStore.write, []

    def write_then_stop(self, window, table, input_hash):
        original(self, window, table, input_hash)
        written.append(window)
        if len(written) == parts:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as patched:
        patched.setattr(PartStore, "write", write_then_stop)
        assert run_cli(*args, "--no-pipeline").returncode == 143


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file below a directory, by relative path, with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()
    }


@pytest.fixture
def stopped(qwen3_causal, copy_model, tmp_path, monkeypatch):
    """A run over 4 windows stopped after 2 parts; its arguments, output, checkpoint files and reference."""
    model = copy_model(qwen3_causal)
    data = write_jsonl(tmp_path / "in.jsonl", many_rows(20, 6))
    base = [data, "--model", model, *LABEL_FLAGS, "--window-rows", "30"]
    reference, out = tmp_path / "reference.parquet", tmp_path / "out.parquet"
    assert run_cli(*base, "-o", reference).returncode == 0
    stopped_after(2, monkeypatch, *base, "-o", out)
    parts = tmp_path / "out.parquet.parts"
    found = snapshot(parts)
    assert sum(name.startswith("part-") for name in found) == 2 and not out.exists()
    return base, out, parts, found, reference


def refused_then_resumed(stopped, refused, why: str, monkeypatch=None) -> None:
    """The refused run exits 2 naming why and changes no checkpoint file; the original --resume completes."""
    base, out, parts, found, reference = stopped
    assert refused.returncode == 2, refused.stderr
    assert why in refused.stderr and "Traceback" not in refused.stderr
    assert snapshot(parts) == found
    assert not out.exists()
    if monkeypatch is not None:
        monkeypatch.undo()
    resumed = run_cli(*base, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert pq.read_table(out).equals(pq.read_table(reference))
    assert not parts.exists()


def test_a_changed_input_is_refused_and_the_parts_stay(stopped):
    base, out, *_ = stopped
    data = base[0]
    original = data.read_text()
    data.write_text(original.replace("item 0 to", "item 9 to", 1))  # window 0 differs
    refused = run_cli(*base, "-o", out, "--resume")
    data.write_text(original)
    refused_then_resumed(stopped, refused, "window 0 differs")


def test_a_changed_flag_is_refused_and_the_parts_stay(stopped):
    base, out, *_ = stopped
    changed = [" a" if arg == " the" else arg for arg in base]
    refused = run_cli(*changed, "-o", out, "--resume")
    refused_then_resumed(stopped, refused, "were written differently: setting")


def test_a_changed_model_is_refused_and_the_parts_stay(stopped):
    base, out, *_ = stopped
    config = Path(base[2]) / "config.json"
    original = config.read_text()
    config.write_text(json.dumps(json.loads(original), indent=4))  # the same model, other file content
    refused = run_cli(*base, "-o", out, "--resume")
    config.write_text(original)
    refused_then_resumed(stopped, refused, "the model's files changed")


def test_another_version_is_refused_and_the_parts_stay(stopped, monkeypatch):
    base, out, *_ = stopped
    monkeypatch.setattr(sys.modules["score_batch.job.checkpoint.identity"], "__version__", "0.0.0+other")
    refused = run_cli(*base, "-o", out, "--resume")
    refused_then_resumed(stopped, refused, "score-batch", monkeypatch)


def test_another_input_digest_version_is_refused_and_the_parts_stay(stopped, monkeypatch):
    from score_batch.job.checkpoint.input_digest import InputDigest

    base, out, *_ = stopped
    monkeypatch.setattr(InputDigest, "VERSION", b"input-digest-0")
    refused = run_cli(*base, "-o", out, "--resume")
    refused_then_resumed(stopped, refused, "were checked with", monkeypatch)


def test_a_shorter_input_is_refused_and_the_parts_stay(stopped):
    base, out, *_ = stopped
    data = base[0]
    original = data.read_text()
    data.write_text("".join(original.splitlines(keepends=True)[:30]))  # 1 window where 2 were checkpointed
    refused = run_cli(*base, "-o", out, "--resume")
    data.write_text(original)
    refused_then_resumed(stopped, refused, "input now ends after 1 windows")
