"""`score --help` as a new user reads it: options in titled panels, one style for defaults, examples within
80 columns, a clean usage line, flags without a type; the same rich look as the top-level help."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.test_cli import REPO

PANELS = ["Input & columns", "Model & scoring", "Output", "Job control", "Engine", "Scale-out on Ray"]


def shown(*args: str, columns: int = 80) -> str:
    """The help a fresh process prints on a terminal of this width (no colours)."""
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-m", "score_batch.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def panel_titles(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"╭─ (.*?) ─", text)]


@pytest.mark.parametrize("columns", [80, 120])
def test_score_help_groups_its_options_in_panels_in_order(columns):
    titles = panel_titles(shown("score", "--help", columns=columns))
    assert [t.split(" (")[0] for t in titles] == [*PANELS, "Options"]  # Options: -h/--help alone


def test_help_fits_80_columns_with_a_clean_usage_line_and_one_default_style():
    for args in (("score", "--help"), ("run-batch", "--help"), ("--help",)):
        text = shown(*args)
        assert max(len(line) for line in text.splitlines()) <= 80, args  # examples included
        assert "<bool>" not in text and "<str>" not in text and "<list" not in text, args
        assert "{input}" not in text
    text = shown("score", "--help")
    assert "score [OPTIONS] INPUT..." in text
    words = " ".join(text.split())
    assert "(default" not in words and "Default:" not in words and "[default: (" not in words
    assert words.count("default") == words.count("[default: ")  # every default in the same brackets
    assert "[default: the bundled demo reranker]" in words and "[default: -1, the last]" in words
    assert "score-batch big/ -o out.parquet" in text  # the examples are there, each line whole


def test_score_help_has_the_top_level_helps_rich_look():
    top, score = shown("--help"), shown("score", "--help")
    for text in (top, score):
        assert "╭─ Options " in text and text.count("╰─") >= 1
    assert "--version " in top and "-h, --help" in score
