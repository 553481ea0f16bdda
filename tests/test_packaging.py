"""A wheel (not an editable install) carries the demo model and the built-in profiles, and nothing stray."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile

import pyarrow.parquet as pq
import pytest

from tests.test_cli import REPO

pytestmark = pytest.mark.slow


def test_wheel_in_a_fresh_venv_runs_the_zero_flag_demo_from_elsewhere(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", wheels, REPO],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("score_batch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cli/demo_model/model.safetensors" in names
    assert "engine/builtin_profiles/qwen3-reranker.json" in names
    assert {name.split("/")[0] for name in names if not name.startswith("score_batch-")} == {
        "cli",
        "engine",
        "io_formats",
        "job",
        "score_batch",
    }
    # torch and the other dependencies come from this interpreter; the project only from the wheel.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [python, "-c", "import cli, engine; print(cli.__file__); print(engine.__file__)"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(REPO) not in where and str(env_dir) in where
    result = subprocess.run(
        [env_dir / "bin" / "score-batch", REPO / "sample_data" / "products.parquet", "-o", "x.parquet"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert pq.read_table(elsewhere / "x.parquet").num_rows == 2698
