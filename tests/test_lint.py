"""The code passes ruff's lint and format checks (the CI runs the suite, so style drift fails it)."""

from __future__ import annotations

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
