"""The code passes ruff's lint and format checks (the CI runs the suite, so style drift fails it), and the
repository stands alone (no file cites the workplace's files outside it)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.test_cli import REPO

RUFF = shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is installed by the test extra")
@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    result = subprocess.run([RUFF, *command], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_file_cites_files_outside_the_repository():
    """The workplace's notes beside the checkout are not part of the repository: nothing cites them."""
    outside = re.compile(r"(?<![\w/])shared/[\w.-]+\.md|/work/" + "shared")
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    cited = []
    for name in listed.stdout.splitlines():
        path = REPO / name
        if path.suffix in (".png", ".parquet", ".safetensors", ".gz", ".zst") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        cited += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}" for m in outside.finditer(text)]
    assert cited == []
