"""The GPU install and bench/gpu_check.sh, checked on the CPU: the carried wheels against the image's
packages, the pip-check filter, the --dry-run listing and the phases of `all` run against stub commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import install_check  # noqa: E402  (bench/install_check.py)

SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _names(requirements) -> set[str]:
    return {install_check.requirement_name(r) for r in requirements}


def test_carried_wheels_are_exactly_what_the_image_lacks_for_flashinfer():
    image = set(install_check.listed_names(ROOT / "bench" / "gpu_image.txt"))
    carried = install_check.listed_names(ROOT / "bench" / "gpu_wheels.txt")
    assert carried[0] == "flashinfer-python" and len(carried) == len(set(carried))
    # A dry resolve of flashinfer-python 0.6.6 against the image: its requirements and theirs.
    needed = _names(install_check.FLASHINFER_066_REQUIRES) | _names(install_check.APACHE_TVM_FFI_REQUIRES)
    missing = needed - image - install_check.LEFT_OUT
    assert missing == {"apache-tvm-ffi"}
    # tabulate: an image may lack it, so it is carried as insurance (pip keeps the
    # image's copy when there is one); nothing else the image has is carried.
    assert set(carried) == {"flashinfer-python"} | missing | {"tabulate"}
    assert {"torch", "numpy", "requests", "urllib3", "packaging", "typing-extensions", "tqdm"} <= image
    assert not set(carried) & {"torch", "numpy", "requests", "urllib3", "packaging", "typing-extensions"}
    assert install_check.LEFT_OUT <= _names(install_check.FLASHINFER_066_REQUIRES)


def _wheel(directory: Path, name: str, version: str, requires: list[str]) -> Path:
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n{meta}")
    return path


def test_wheel_check_reads_requirements_and_finds_an_unmet_one(tmp_path):
    flashinfer = _wheel(tmp_path, "flashinfer-python", "0.6.6", list(install_check.FLASHINFER_066_REQUIRES))
    assert install_check.wheel_requires(flashinfer) == (
        "flashinfer-python",
        list(install_check.FLASHINFER_066_REQUIRES),
    )
    tvm = _wheel(
        tmp_path, "apache-tvm-ffi", "0.1.15.post2", ["typing-extensions>=4.13", 'ninja; extra == "cpp"']
    )
    assert install_check.wheel_requires(tvm)[1] == ["typing-extensions>=4.13"]
    _wheel(tmp_path, "tabulate", "0.10.0", [])
    assert install_check.main(["wheels", str(tmp_path)]) == 0
    _wheel(tmp_path, "apache-tvm-ffi", "0.1.15.post2", ["typing-extensions>=4.13", "left-pad"])
    (tmp_path / "apache_tvm_ffi-0.1.15.post2-py3-none-any.whl").unlink()
    _wheel(tmp_path, "apache-tvm-ffi", "0.1.16", ["left-pad"])
    assert install_check.main(["wheels", str(tmp_path)]) == 1  # left-pad: neither in the image nor carried


def test_pip_check_allows_only_the_known_omissions_and_old_problems():
    before = "old-pkg 1.0 has requirement foo<2, but you have foo 3.0.\n"
    after = (
        before
        + "flashinfer-python 0.6.6 requires nvidia-cudnn-frontend, which is not installed.\n"
        + "flashinfer-python 0.6.6 requires nvidia-cutlass-dsl, which is not installed.\n"
    )
    assert install_check.new_problems(before, after) == []
    assert (
        install_check.new_problems("No broken requirements found.\n", "No broken requirements found.\n") == []
    )
    broken = after + "flashinfer-python 0.6.6 has requirement packaging>=24.2, but you have packaging 23.0.\n"
    assert install_check.new_problems(before, broken) == [broken.splitlines()[-1]]


def _run(*args, env=None, cwd=ROOT):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=cwd)


def test_dry_run_prints_every_command_and_runs_none(tmp_path):
    out = tmp_path / "out"
    result = _run("--dry-run", "all", env={**os.environ, "OUT": str(out)})
    assert result.returncode == 0, result.stderr
    lines = [line[2:] for line in result.stdout.splitlines() if line.startswith("+ ")]
    text = "\n".join(lines)
    site = str(ROOT / ".cache" / "gpu" / "site")
    order = [
        "FLASHINFER_WORKSPACE_BASE=" + str(ROOT / ".cache" / "gpu"),
        "timeout -s INT --kill-after=5 180 bash",
        "python bench/install_check.py wheels .wheels",
        "python -m pip check >",
        "<is sysconfig purelib writable?>",
        "python -m pip install --no-index --find-links .wheels apache-tvm-ffi tabulate",
        "python -m pip install --no-index --no-deps --find-links .wheels flashinfer-python==0.6.6",
        "# if not writable:",
        f"mkdir -p {site} && export PYTHONPATH={site}:$PYTHONPATH",
        f"python -m pip install --no-index --no-deps --upgrade --target {site} --find-links .wheels "
        "apache-tvm-ffi tabulate flashinfer-python==0.6.6",
        "python bench/install_check.py pip-check",
        "echo '#include <curand_kernel.h>' | nvcc -x cu -E - -o /dev/null",
        "echo '#include <cublasLt.h>' | nvcc -x cu -E - -o /dev/null",
        "python bench/gpu.py warmup --out " + str(out / "warmup.json"),
        "timeout -s INT --kill-after=5 210 bash",
        "python -m pytest -q -rA tests/gpu/test_flashinfer.py tests/gpu/test_flashinfer_split.py "
        "tests/gpu/test_native_ops.py tests/gpu/test_flashinfer_runs.py tests/gpu/test_flex_compile.py "
        "--junitxml=" + str(out / "gpu-tests.xml"),
        "timeout -s INT --kill-after=5 170 bash",
        "python bench/gpu.py bench --out "
        + str(out / "gpu.json")
        + " --workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi fa3 fi-native-compile",
    ]
    positions = [text.find(step) for step in order]
    assert -1 not in positions, [s for s, p in zip(order, positions) if p == -1]
    assert positions == sorted(positions)
    # only flashinfer skips its deps (and the --target fallback, which resolves nothing against the image)
    assert text.count("pip install --no-index --no-deps --find-links") == 1
    assert "TORCHINDUCTOR_CACHE_DIR=" + str(ROOT / ".cache" / "gpu" / "inductor") in text
    assert not out.exists()  # nothing ran, nothing was written


def test_every_gpu_test_module_runs_and_limits_fit_one_device_command():
    script = SCRIPT.read_text()
    listed = set(re.findall(r"tests/gpu/(test_\w+\.py)", script.split("GPU_TESTS=(", 1)[1].split(")", 1)[0]))
    assert listed == {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    limits = {k: int(v) for k, v in re.findall(r"^(\w+_LIMIT)=\$\{\w+:-(\d+)\}", script, re.M)}
    assert limits["ALL_LIMIT"] == limits["INSTALL_LIMIT"] + limits["TESTS_LIMIT"] + limits["BENCH_LIMIT"]
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)", script, re.M).group(1))
    assert limits["ALL_LIMIT"] + 3 * kill_after <= 600 - 20  # the device's one command, with margin
    outputs = {
        "summary.txt",
        "install.log",
        "warmup.json",
        "gpu-tests.txt",
        "gpu-tests.xml",
        "bench.txt",
        "gpu.json",
    }
    assert all(name in script for name in outputs) and len(outputs) <= 8  # the device returns at most 8 files


def test_cache_folder_is_git_ignored():
    result = subprocess.run(
        ["git", "check-ignore", "-q", ".cache/gpu/flashinfer/x.so"], cwd=ROOT, capture_output=True
    )
    assert result.returncode == 0


STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
IFS='|' read -ra patterns <<< "$STUB_FAIL"
for pattern in "${patterns[@]}"; do
  case "$*" in
    *"$pattern"*) echo "stub failure: $*"; exit 3 ;;
  esac
done
exit 0
"""


def _stub_env(tmp_path, fail=None):
    """(env, calls log, out): python, nvidia-smi and nvcc are stubs that log their arguments and fail on a
    '|'-separated list of substrings."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("python", "nvidia-smi", "nvcc"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out = tmp_path / "out"
    log = tmp_path / "calls.log"
    env = {
        **os.environ,
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "OUT": str(out),
        "WHEELS": str(wheels),
        "STUB_LOG": str(log),
        "STUB_FAIL": fail or "<never>",
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
    }
    return env, log, out


@pytest.mark.parametrize("fail", [None, "-m pytest"])
def test_all_runs_every_phase_and_records_each_status(tmp_path, fail):
    env, log, out = _stub_env(tmp_path, fail)
    result = _run("all", env=env)
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["install", "tests", "bench"]
    calls = log.read_text()
    assert "-m pytest -q -rA tests/gpu/test_flashinfer.py" in calls and "bench/gpu.py bench" in calls
    assert "bench/gpu.py warmup" in calls
    limits = [int(line.rsplit("limit=", 1)[1]) for line in summary]
    # a quick phase leaves its unused seconds to the next: tests get far more than their own 210 s
    assert limits[0] == 180 and 380 <= limits[1] <= 390 and 540 <= limits[2] <= 560
    if fail is None:
        assert result.returncode == 0, result.stderr
        assert all("exit=0 " in line for line in summary)
    else:
        assert result.returncode == 1 and "some phase failed" in result.stderr
        assert [("exit=0 " in line) for line in summary] == [True, False, True]


def test_a_read_only_image_gets_pip_install_target_and_pythonpath(tmp_path):
    env, log, out = _stub_env(tmp_path, fail="sysconfig")  # the writability check says no
    result = _run("install", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    calls = log.read_text()
    site = str(ROOT / ".cache" / "gpu" / "site")
    assert f"-m pip install --no-index --no-deps --upgrade --target {site}" in calls
    assert (
        "--find-links" in calls and "-m pip install --no-index --find-links" not in calls
    )  # nothing into the image
    assert " -e ." not in calls  # no editable install: the checkout is on PYTHONPATH
    assert "not writable" in (out / "install.log").read_text()


def test_a_lone_phase_survives_an_install_with_a_new_pip_check_line(tmp_path):
    # flashinfer not importable yet: the tests phase installs first; pip check then reports a new problem
    env, log, out = _stub_env(tmp_path, fail="import flashinfer|install_check.py pip-check")
    result = _run("tests", env=env)
    calls = log.read_text()
    assert "install_check.py pip-check" in calls and "bench/gpu.py warmup" in calls
    assert "-m pytest -q -rA tests/gpu/" in calls, result.stdout + result.stderr  # the tests still ran
    assert result.returncode == 0 and "install ended with status" in result.stderr


def test_an_fa3_build_error_in_the_warm_up_skips_fa3_later(tmp_path):
    function = re.search(r"^no_fa3\(\) \{.*?^\}", SCRIPT.read_text(), re.M | re.S).group(0)
    (tmp_path / "warmup.json").write_text(
        json.dumps({"jit": {"fa3": {"error": "RuntimeError: Ninja build failed"}}})
    )
    script = (
        f'say() {{ :; }}\nDRY=0\nOUT={tmp_path}\n{function}\nno_fa3 >/dev/null\necho "$SCORE_BATCH_NO_FA3"'
    )
    python_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": f"{python_dir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert result.stdout.strip().endswith("RuntimeError: Ninja build failed"), result.stderr
    (tmp_path / "warmup.json").write_text(json.dumps({"jit": {"fa3": {"seconds": 91.0}}}))
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert result.stdout.strip() == ""
