"""A wheel (not an editable install) carries the demo model and the built-in profiles, and nothing stray."""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
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
    assert "score_batch/cli/demo_model/model.safetensors" in names
    for name in ("modules.json", "chat_template.jinja", "1_LogitScore/config.json"):  # CrossEncoder's files
        assert f"score_batch/cli/demo_model/{name}" in names
    assert "score_batch/engine/model/builtin_profiles/qwen3-reranker.json" in names
    assert {name.split("/")[0] for name in names if not name.startswith("score_batch-")} == {"score_batch"}
    assert not [name for name in names if "tiny_models" in name or name.startswith("score_batch/tests")]
    # torch and the other dependencies come from this interpreter wherever it keeps them (system-wide or a
    # virtualenv); the project only from the wheel.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    new_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (tmp_path / "venv" / new_site).joinpath("dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # A user's own folders named like our subpackages, beside their script, shadow nothing.
    for name in ("engine", "cli", "job", "io_formats"):
        (elsewhere / name).mkdir()
        (elsewhere / name / "__init__.py").write_text("raise ImportError('the user folder was imported')\n")
    (elsewhere / "script.py").write_text(
        "import score_batch.cli, score_batch.engine\n"
        "from score_batch import Scorer, demo_model_path\n"
        "print(score_batch.cli.__file__)\n"
        "print(score_batch.engine.__file__)\n"
        "scores = Scorer(demo_model_path()).predict([('wireless mouse', 'Logitech M185 wireless mouse')])\n"
        "print(float(scores[0]))\n"
    )
    where = subprocess.run([python, "script.py"], cwd=elsewhere, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    lines = where.stdout.splitlines()
    assert str(REPO) not in where.stdout and all(str(env_dir) in line for line in lines[:2])
    assert 0.0 <= float(lines[2]) <= 1.0
    result = subprocess.run(
        [env_dir / "bin" / "score-batch", REPO / "sample_data" / "products.parquet", "-o", "x.parquet"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert pq.read_table(elsewhere / "x.parquet").num_rows == 2698
