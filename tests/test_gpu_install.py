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
    # tabulate: missing from one of the two lists of the image, so carried as insurance (pip keeps the
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
    cache = ROOT / ".cache" / "gpu"
    order = [
        f"FLASHINFER_WORKSPACE_BASE={cache}",
        f"timeout -s INT --kill-after=5 200 bash {SCRIPT} install",
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
        f"python bench/gpu.py warmup --out {cache / 'warmup.json'}",  # FA2 and the ops, FA3 left out
        f"cp {cache / 'warmup.json'} {out / 'warmup.json'}",
        f"timeout -s INT --kill-after=5 200 bash {SCRIPT} tests",
        f"python bench/install_check.py fa3 {cache / 'warmup.json'}",  # FA3 skipped until proven
        "python -m pytest -q -rA tests/gpu/test_flashinfer.py tests/gpu/test_flashinfer_split.py "
        "tests/gpu/test_native_ops.py tests/gpu/test_flashinfer_runs.py tests/gpu/test_flex_compile.py "
        "--junitxml=" + str(out / "gpu-tests.xml"),
        f"timeout -s INT --kill-after=5 160 bash {SCRIPT} bench",
        "python bench/gpu.py bench --out "
        + str(out / "gpu.json")
        + " --workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi pipeline "
        "fi-native-compile",
    ]
    positions = [text.find(step) for step in order]
    assert -1 not in positions, [s for s, p in zip(order, positions) if p == -1]
    assert positions == sorted(positions)
    # only flashinfer skips its deps (and the --target fallback, which resolves nothing against the image)
    assert text.count("pip install --no-index --no-deps --find-links") == 1
    assert "TORCHINDUCTOR_CACHE_DIR=" + str(ROOT / ".cache" / "gpu" / "inductor") in text
    assert "fa3" not in text.replace("install_check.py fa3", "").replace("SCORE_BATCH_NO_FA3", "")
    assert not out.exists()  # nothing ran, nothing was written


def test_dry_run_of_the_fa3_call_builds_it_in_the_background_then_tests_and_benches_it(tmp_path):
    out = tmp_path / "out"
    result = _run("--dry-run", "fa3", env={**os.environ, "OUT": str(out)})
    assert result.returncode == 0, result.stderr
    text = "\n".join(line[2:] for line in result.stdout.splitlines() if line.startswith("+ "))
    cache = ROOT / ".cache" / "gpu"
    order = [
        "PHASE_LIMIT=330 timeout -s INT --kill-after=5 330 bash",
        "python bench/gpu.py warmup --out",  # a fresh machine installs first (FA2 and the ops)
        f"setsid bash -c 'python bench/gpu.py warmup --fa3 --out {cache / 'warmup.json'}; "
        f"echo $? > {cache / 'fa3-build.status'}' > {cache / 'fa3-build.log'} 2>&1 < /dev/null &",
        f"sleep 2 until {cache / 'fa3-build.status'} exists",
        f"python bench/install_check.py fa3 {cache / 'warmup.json'}",
        "PHASE_LIMIT=110 timeout -s INT --kill-after=5 110 bash",
        f"python -m pytest -q -rA -k fa3 tests/gpu/test_flashinfer.py --junitxml={out / 'gpu-tests-fa3.xml'}",
        "PHASE_LIMIT=120 timeout -s INT --kill-after=5 120 bash",
        f"python bench/gpu.py bench --out {out / 'gpu-fa3.json'} --workloads a --queries 4 --methods hf "
        "fi-native-fi fa3",
    ]
    positions = [text.find(step) for step in order]
    assert -1 not in positions, [s for s, p in zip(order, positions) if p == -1]
    assert positions == sorted(positions)
    assert text.count("pip install --no-index --no-deps --find-links") == 1  # the install listed once
    assert not out.exists()


def test_every_gpu_test_module_runs_and_limits_fit_one_device_command():
    script = SCRIPT.read_text()
    listed = set(re.findall(r"tests/gpu/(test_\w+\.py)", script.split("GPU_TESTS=(", 1)[1].split(")", 1)[0]))
    assert listed == {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    limits = {k: int(v) for k, v in re.findall(r"^(\w+_LIMIT)=\$\{\w+:-(\d+)\}", script, re.M)}
    assert limits["ALL_LIMIT"] == limits["INSTALL_LIMIT"] + limits["TESTS_LIMIT"] + limits["BENCH_LIMIT"]
    assert (
        limits["FA3_LIMIT"]
        == limits["FA3_BUILD_LIMIT"] + limits["FA3_TESTS_LIMIT"] + limits["FA3_BENCH_LIMIT"]
    )
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)", script, re.M).group(1))
    for total in ("ALL_LIMIT", "FA3_LIMIT"):
        assert limits[total] + 3 * kill_after <= 600 - 20  # the device's one command, with margin
    # The slowest FA3 object measured (231 s on 2 cores) fits the FA3 build's share with room for its link.
    assert limits["FA3_BUILD_LIMIT"] >= 1.3 * 231
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
    fa3 = {
        "summary.txt",
        "install.log",
        "fa3-build.log",
        "warmup.json",
        "gpu-tests-fa3.txt",
        "gpu-tests-fa3.xml",
    }
    fa3 |= {"bench-fa3.txt", "gpu-fa3.json"}
    assert all(name in script for name in fa3) and len(fa3) <= 8


def test_cache_folder_is_git_ignored():
    result = subprocess.run(
        ["git", "check-ignore", "-q", ".cache/gpu/flashinfer/x.so"], cwd=ROOT, capture_output=True
    )
    assert result.returncode == 0


STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
# the FA3 skip rule reads warmup.json for real
[ "$(basename "$0") $1 $2" = "python bench/install_check.py fa3" ] && exec "$REAL_PYTHON" "$@"
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
        "REAL_PYTHON": sys.executable,
        "GPU_CHECK_CACHE": str(tmp_path / "cache"),
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
    # a quick phase leaves its unused seconds to the next: tests get far more than their own 200 s
    assert limits[0] == 200 and 390 <= limits[1] <= 400 and 540 <= limits[2] <= 560
    assert "warmup --fa3" not in calls and " fa3" not in calls.split("bench/gpu.py bench", 1)[1]
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
    site = str(tmp_path / "cache" / "site")
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


@pytest.mark.parametrize(
    ("warmup", "why"),
    [
        (None, "FA3 was never built here"),
        ({"jit": {"fa2": {"seconds": 40.0}}, "calls": {"fa2": {"first_call_s": 1.0}}}, "`all` leaves it out"),
        (
            {"jit": {"fa3": {"seconds": 310.5, "error": "RuntimeError: Ninja build failed"}}},
            "Ninja build failed",
        ),
        (
            {"jit": {"fa3": {"seconds": 291.0}}, "calls": {}},
            "its warm-up call did not succeed: no call recorded",
        ),
        (
            {"jit": {"fa3": {"seconds": 291.0}}, "calls": {"fa3": {"error": "CUDA error"}}},
            "succeed: CUDA error",
        ),
        ({"jit": {"fa3": {"seconds": 291.0}}, "calls": {"fa3": {"first_call_s": 0.9}}}, ""),
    ],
)
def test_fa3_runs_only_where_warmup_json_holds_its_build_time_and_a_successful_call(tmp_path, warmup, why):
    function = re.search(r"^no_fa3\(\) \{.*?^\}", SCRIPT.read_text(), re.M | re.S).group(0)
    if warmup is not None:
        (tmp_path / "warmup.json").write_text(json.dumps(warmup))
    script = (
        f'say() {{ :; }}\nDRY=0\nCACHE={tmp_path}\n{function}\nno_fa3 >/dev/null\necho "$SCORE_BATCH_NO_FA3"'
    )
    python_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": f"{python_dir}{os.pathsep}{os.environ['PATH']}",
        "SCORE_BATCH_NO_FA3": "stale",
    }
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (why in result.stdout) if why else result.stdout.strip() == ""


def _fa3_proven(cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    record = {"jit": {"fa3": {"seconds": 291.0, "dirty_after": 0}}, "calls": {"fa3": {"first_call_s": 0.9}}}
    (cache / "warmup.json").write_text(json.dumps(record))


@pytest.mark.parametrize("built", [True, False], ids=["built", "build-failed"])
def test_the_fa3_call_builds_in_the_background_and_tests_and_benches_fa3_only_once_proven(tmp_path, built):
    env, log, out = _stub_env(tmp_path, fail=None if built else "warmup --fa3")
    cache = tmp_path / "cache"
    if built:
        _fa3_proven(cache)  # what the stubbed `gpu.py warmup --fa3` would have recorded
    result = _run("fa3", env=env)
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["fa3-build", "fa3-tests", "fa3-bench"]
    calls = log.read_text()
    assert "python bench/gpu.py warmup --fa3 --out " + str(cache / "warmup.json") in calls
    assert (cache / "fa3-build.status").read_text().strip() == ("0" if built else "3")
    assert (out / "fa3-build.log").exists()
    if built:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "-m pytest -q -rA -k fa3 tests/gpu/test_flashinfer.py" in calls
        assert (
            "bench/gpu.py bench --out " + str(out / "gpu-fa3.json") in calls and "fi-native-fi fa3" in calls
        )
        assert json.loads((out / "warmup.json").read_text())["calls"]["fa3"]["first_call_s"] == 0.9
    else:  # no build time, no call: nothing of FA3 runs, and the call says so
        assert result.returncode == 1 and "-m pytest" not in calls and "bench/gpu.py bench" not in calls
        assert [("exit=0 " in line) for line in summary] == [False, False, False]
        assert "not run: no warmup.json on this machine: FA3 was never built here" in result.stdout
        assert "stub failure: bench/gpu.py warmup --fa3" in (out / "fa3-build.log").read_text()
        assert "goes on in the background" not in result.stdout  # it ended: its status is there


def test_a_later_fa3_call_waits_for_the_build_an_earlier_call_left_running(tmp_path):
    env, log, out = _stub_env(tmp_path)
    cache = tmp_path / "cache"
    _fa3_proven(cache)
    status = cache / "fa3-build.status"
    earlier = subprocess.Popen(["bash", "-c", f"sleep 3; echo 0 > {status}"])  # the build of the cut-off call
    (cache / "fa3-build.pid").write_text(f"{earlier.pid}\n")
    try:
        result = _run("fa3", env=env)
    finally:
        earlier.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"an earlier call's FA3 build (pid {earlier.pid}) is still running: waiting for it" in result.stdout
    )
    calls = log.read_text()
    assert (
        "warmup --fa3" not in calls and "-m pytest -q -rA -k fa3" in calls
    )  # no second build; FA3 then tested
