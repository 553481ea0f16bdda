"""Start-up: --version, --help and `models` import none of the heavy libraries a run needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "pyarrow", "boto3", "botocore", "fsspec", "ray", "numpy", "safetensors")


def imported_modules(*args: str) -> tuple[set[str], subprocess.CompletedProcess]:
    """The top-level modules a fresh `python -X importtime -m score_batch.cli.main ARGS` imports, and the run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "score_batch.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "100"},
        timeout=120,
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return names, done


@pytest.mark.parametrize(
    "args",
    [("--version",), ("--help",), ("score", "--help"), ("run-batch", "--help")],
    ids=lambda args: " ".join(args),
)
def test_version_and_help_import_no_heavy_library(args):
    names, done = imported_modules(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "typer" in names  # the import log was read
    assert not names & set(HEAVY), sorted(names & set(HEAVY))
    assert ("score-batch" in done.stdout) if args == ("--version",) else ("Usage" in done.stdout)


def test_a_bad_flag_value_is_refused_without_heavy_imports():
    names, done = imported_modules("in.jsonl", "--packing", "pairs")
    assert done.returncode == 2 and "pairs" in done.stderr
    assert not names & {"torch", "transformers"}


def test_models_imports_no_torch():
    names, done = imported_modules("models")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Supported models" in done.stdout
    assert not names & {"torch", "transformers", "pyarrow"}, sorted(names & set(HEAVY))


def test_a_demo_run_does_not_load_the_batch_file_command(tmp_path):
    """A table run scores the demo's first row and never imports the batch-file command's module."""
    one = tmp_path / "one.jsonl"
    one.write_text((REPO / "sample_data/products.jsonl").read_text().splitlines()[0] + "\n")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "score_batch.cli.main", str(one), "-o", "-", "--quiet"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"score": ' in done.stdout
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "torch" in modules and "tokenizers" in modules  # the import log was read
    assert "score_batch.job.runners.batch_file_run" not in modules


def _fresh(code: str) -> str:
    """stdout of a fresh Python running code (the checkout importable)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.parametrize("imported_first", [False, True])
def test_transformers_is_quiet_whether_imported_before_or_after(imported_first):
    """quiet_libraries no longer imports transformers: a later import reads the settings it left."""
    before = "import transformers; " if imported_first else ""
    code = (
        f"{before}import sys; from score_batch.cli.logs import quiet_libraries; quiet_libraries(); "
        "print('transformers' in sys.modules); import transformers, logging; "
        "from transformers.utils import logging as hf; from huggingface_hub.utils import are_progress_bars_disabled; "
        "print(hf.get_verbosity() == logging.ERROR, hf.is_progress_bar_enabled(), are_progress_bars_disabled())"
    )
    assert _fresh(code).splitlines() == [str(imported_first), "True False True"]
