"""The GPU install and bench/gpu_check.sh, checked on the CPU: the carried wheels against the image's
packages, the pip-check filter, the --dry-run listing and the phases of `all` run against stub commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
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
        "phase install: estimate 160 s, limit 235 s",
        f"timeout -s INT --kill-after=5 235 bash {SCRIPT} install",
        # the link probe before anything else: FlashInfer's own link flags
        "export CUDA_HOME=$(dirname $(dirname $(readlink -f <nvcc --dryrun's _HERE_>/nvcc)))",
        "$CUDA_HOME/bin/nvcc -c -Xcompiler -fPIC probe.cu && c++ probe.o -shared -L$CUDA_HOME/lib64 "
        "-L$CUDA_HOME/lib64/stubs -lcudart -lcuda $FLASHINFER_EXTRA_LDFLAGS -o probe.so",
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
        "tar -xzf $JIT_MODULES -C <flashinfer.jit.env.FLASHINFER_AOT_DIR>",  # modules a former call built
        f"python bench/gpu.py warmup --out {cache / 'warmup.json'} --after-build "
        f"bash\\ {SCRIPT}\\ fa3-start",  # FA2 and the ops, then FA3 started in the background
        f"setsid nice -n 19 bash -c 'python bench/gpu.py warmup --fa3 --out {cache / 'warmup-fa3.json'}; "
        f"echo $? > {cache / 'fa3-build.status'}' > {cache / 'fa3-build.log'} 2>&1 < /dev/null &",
        f"python bench/install_check.py merge {out / 'warmup.json'} {cache / 'warmup.json'} "
        f"{cache / 'warmup-fa3.json'}",
        "phase tests: estimate 85 s, limit 125 s",
        f"timeout -s INT --kill-after=5 125 bash {SCRIPT} tests",
        f"source {cache / 'cuda.env'}",  # the probe's CUDA_HOME and link flags in every later phase
        f"python bench/install_check.py fa3 {cache / 'warmup-fa3.json'}",  # FA3 skipped until proven
        "python -m pytest -q -rA tests/gpu/test_flashinfer.py tests/gpu/test_bf16_numerics.py tests/gpu/test_isolation.py "
        "tests/gpu/test_flashinfer_split.py tests/gpu/test_native_ops.py --junitxml="
        + str(out / "gpu-tests.xml"),
        "phase bench: estimate 120 s, limit 175 s",
        f"timeout -s INT --kill-after=5 175 bash {SCRIPT} bench",
        f"export GPU_CHECK_FA3_STATUS={cache / 'fa3-build.status'}",  # the fa3 method waits for the build
        "python bench/gpu.py bench --out "
        + str(out / "gpu.json")
        + " --workloads a --queries 4 --methods hf fi-hf-layers fi-native-torch fi-native-fi pipeline xlmr fa3",
        "phase collect: estimate 10 s, limit 30 s",
        f"tar -czf {out / 'jit-modules.tar.gz'} -C <the JIT cache's cached_ops> <module>/<module>.so",
    ]
    positions = [text.find(step) for step in order]
    assert -1 not in positions, [s for s, p in zip(order, positions) if p == -1]
    assert positions == sorted(positions)
    # only flashinfer skips its deps (and the --target fallback, which resolves nothing against the image)
    assert text.count("pip install --no-index --no-deps --find-links") == 1
    assert "TORCHINDUCTOR_CACHE_DIR=" + str(ROOT / ".cache" / "gpu" / "inductor") in text
    phases = re.findall(r"phase (\w+): estimate (\d+) s, limit (\d+) s", text)
    assert [name for name, _, _ in phases] == ["install", "tests", "bench", "collect"]
    assert all(int(estimate) <= 0.7 * int(limit) for _, estimate, limit in phases)
    assert "test_flex_compile" not in text and "fi-native-compile" not in text  # a later call's
    assert not out.exists()  # nothing ran, nothing was written


def test_host_phase_runs_the_host_bench_after_the_install_and_takes_its_arguments(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    default = [
        line[2:] for line in _run("--dry-run", "host", env=env).stdout.splitlines() if line.startswith("+ ")
    ]
    install = next(i for i, line in enumerate(default) if line.startswith("python -c 'import flashinfer'"))
    bench = [i for i, line in enumerate(default) if line.startswith("python bench/host_path.py")]
    assert len(bench) == 1 and install < bench[0]
    assert default[bench[0]].startswith("python bench/host_path.py --items 100000 --shapes 1000x27 1500x40")
    given = _run("--dry-run", "host", "--items", "5000", "--modes", "dry", env=env).stdout
    assert "+ python bench/host_path.py --items 5000 --modes dry" in given
    assert not (tmp_path / "out").exists()


def test_every_gpu_test_module_runs_and_limits_fit_one_device_command():
    script = SCRIPT.read_text()
    in_all = re.findall(r"tests/gpu/(test_\w+\.py)", script.split("ALL_TESTS=(", 1)[1].split(")", 1)[0])
    rest = re.findall(r"tests/gpu/(test_\w+\.py)", script.split("GPU_TESTS=(", 1)[1].split(")", 1)[0])
    assert set(in_all) | set(rest) == {p.name for p in (ROOT / "tests" / "gpu").glob("test_*.py")}
    assert "test_isolation.py" in in_all and "test_flex_compile.py" in rest  # a lone `tests` runs them all
    limits = {k: int(v) for k, v in re.findall(r"^(\w+_LIMIT)=\$\{\w+:-(\d+)\}", script, re.M)}
    estimates = {k: int(v) for k, v in re.findall(r"^(\w+)_ESTIMATE=(\d+)", script, re.M)}
    assert limits["ALL_LIMIT"] == limits["INSTALL_LIMIT"] + limits["TESTS_LIMIT"] + limits["BENCH_LIMIT"]
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)", script, re.M).group(1))
    # the device's one command, with margin: the phases, collect, and each one's SIGKILL grace
    assert limits["ALL_LIMIT"] + limits["COLLECT_LIMIT"] + 4 * kill_after <= 600 - 15
    for phase in ("INSTALL", "TESTS", "BENCH", "COLLECT"):  # each estimate at most 70% of its limit
        assert estimates[phase] <= 0.7 * limits[f"{phase}_LIMIT"], phase
    readme = (ROOT / "bench" / "README.md").read_text()
    for phase in ("install", "tests", "bench", "collect"):  # the estimate written beside the limit
        row = f"| `all` {phase} | {limits[phase.upper() + '_LIMIT']} | {estimates[phase.upper()]} |"
        assert row in readme, row
    outputs = {
        "summary.txt",
        "install.log",
        "warmup.json",
        "gpu-tests.txt",
        "gpu-tests.xml",
        "bench.txt",
        "gpu.json",
        "jit-modules.tar.gz",
    }
    assert all(name in script for name in outputs) and len(outputs) <= 8  # the device returns at most 8 files
    written = {name for name in re.findall(r"\$OUT/([\w.-]+)", script) if not name.endswith(".tmp")}
    # host.txt: the host phase, a call of its own; profile.log: the profile call's (its other files as all's)
    assert written <= outputs | {"host.txt", "profile.log"}, written - outputs


def test_cache_folder_is_git_ignored():
    result = subprocess.run(
        ["git", "check-ignore", "-q", ".cache/gpu/flashinfer/x.so"], cwd=ROOT, capture_output=True
    )
    assert result.returncode == 0


STUB = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
# the FA3 skip rule and the warm-up records' merge run for real
case "$(basename "$0") $1 $2" in
  "python bench/install_check.py fa3" | "python bench/install_check.py merge") exec "$REAL_PYTHON" "$@" ;;
esac
IFS='|' read -ra patterns <<< "$STUB_FAIL"
for pattern in "${patterns[@]}"; do
  case "$*" in
    *"$pattern"*) echo "stub failure: $*"; exit 3 ;;
  esac
done
case "$*" in
  *"$STUB_SLEEP"*) sleep 10 ;;
  "bench/gpu.py bench --out "*) echo '{}' > "$4" ;;  # the bench's report
esac
exit 0
"""


def _stub_env(tmp_path, fail=None, **extra):
    """(env, calls log, out): python, nvidia-smi, nvcc and c++ are stubs that log their arguments and fail on a
    '|'-separated list of substrings (the link probe's c++ on '-lcuda', say)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("python", "nvidia-smi", "nvcc", "c++"):
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
        "STUB_SLEEP": "<never>",
        "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
        **extra,
    }
    env.pop("CUDA_HOME", None)
    return env, log, out


@pytest.mark.parametrize(
    ("fail", "status", "exits"),
    [
        (None, 0, [0, 0, 0, 0]),
        ("-m pytest", 1, [0, 3, 0, 0]),  # data came back (gpu.json), a phase failed
        ("-lcuda", 1, [3, 0, 0, 0]),  # the link probe failed: no warm-up; the tests and the bench still ran
        ("-lcuda|-m pytest|bench/gpu.py bench", 3, [3, 3, 3, 0]),  # nothing to report
    ],
)
def test_all_runs_every_phase_and_records_each_status(tmp_path, fail, status, exits):
    env, log, out = _stub_env(tmp_path, fail)
    result = _run("all", env=env)
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["install", "tests", "bench", "collect"]
    calls = log.read_text()
    assert "-m pytest -q -rA tests/gpu/test_flashinfer.py" in calls and "bench/gpu.py bench" in calls
    assert ("bench/gpu.py warmup" in calls) == (fail is None or "-lcuda" not in fail)
    limits = [int(line.split("limit=")[1].split()[0]) for line in summary]
    # a quick phase leaves its unused seconds to the next: tests get far more than their own 125 s
    assert limits[0] == 235 and 350 <= limits[1] <= 360 and 525 <= limits[2] <= 535 and limits[3] >= 30
    assert [int(line.split("exit=")[1].split()[0]) for line in summary] == exits
    assert result.returncode == status, result.stdout + result.stderr
    if status == 1:
        assert "data came back, but a phase failed or was cut" in result.stderr
    if status == 3:
        assert "nothing to report" in result.stderr
    if fail == "-lcuda":
        assert "link probe FAILED" in (out / "install.log").read_text()
        assert "no JIT warm-up: the link probe failed" in result.stderr


def test_a_phase_cut_at_its_limit_says_which_step_it_cut(tmp_path):
    limits = dict(INSTALL_LIMIT="2", TESTS_LIMIT="60", BENCH_LIMIT="60", ALL_LIMIT="122")
    env, log, out = _stub_env(tmp_path, STUB_SLEEP="bench/gpu.py warmup", **limits)
    result = _run("all", env=env)
    install = (out / "summary.txt").read_text().splitlines()[0]
    assert (
        install.startswith("install exit=124 ")
        and "cut at its limit in: python bench/gpu.py warmup" in install
    )
    assert result.returncode == 1  # the tests and the bench still came back


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
        ({"jit": {"fa2": {"seconds": 40.0}}, "calls": {"fa2": {"first_call_s": 1.0}}}, "FA3 is not built"),
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
        (tmp_path / "warmup-fa3.json").write_text(json.dumps(warmup))
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


def test_fa3_starts_in_the_background_and_records_its_status(tmp_path):
    env, log, out = _stub_env(tmp_path)
    cache = tmp_path / "cache"
    result = _run("fa3-start", env=env)  # what the warm-up starts once FA2's modules are built
    assert result.returncode == 0 and "FA3's build started in the background" in result.stdout
    status = cache / "fa3-build.status"
    for _ in range(100):
        if status.exists():
            break
        time.sleep(0.1)
    assert status.read_text().strip() == "0"
    assert f"python bench/gpu.py warmup --fa3 --out {cache / 'warmup-fa3.json'}" in log.read_text()
    assert (cache / "fa3-build.pid").read_text().strip().isdigit()


@pytest.mark.parametrize(
    ("status", "record", "why"),
    [
        (None, None, "had not finished by this phase's deadline"),
        (
            "1",
            {"jit": {"fa3": {"seconds": 200.0, "error": "RuntimeError: Ninja build failed"}}},
            "Ninja build",
        ),
        ("0", {"jit": {"fa3": {"seconds": 290.0}}, "calls": {"fa3": {"first_call_s": 0.8}}}, None),
    ],
)
def test_the_bench_waits_for_fa3s_build_until_its_deadline(tmp_path, monkeypatch, status, record, why):
    import gpu  # bench/gpu.py

    status_file, record_file = tmp_path / "fa3-build.status", tmp_path / "warmup-fa3.json"
    if record is not None:
        record_file.write_text(json.dumps(record))
    now = [1000.0]
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds
        if status is not None and len(sleeps) == 3:  # the build ends while the bench waits
            status_file.write_text(status + "\n")

    monkeypatch.setenv(gpu.FA3_STATUS, str(status_file))
    monkeypatch.setenv(gpu.FA3_RECORD, str(record_file))
    monkeypatch.setenv(gpu.FA3_DEADLINE, "1030")
    result = gpu.fa3_waited(sleep=sleep, clock=lambda: now[0])
    assert (why in result) if why else result is None
    assert len(sleeps) == (15 if status is None else 3)  # waited until the deadline, or until the build ended


# --- the link probe, for real: this machine's nvcc and c++, FlashInfer's link flags ---------------------------
NVCC, CXX = shutil.which("nvcc"), shutil.which("c++")
needs_nvcc = pytest.mark.skipif(NVCC is None or CXX is None, reason="the link probe needs nvcc and c++")


def _real_cuda_home() -> Path:
    """The folder above the real nvcc, as nvcc itself names it (through any wrapper script)."""
    dry = subprocess.run(
        [NVCC, "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True
    )
    here = re.search(r"^#\$ _HERE_=(.*)$", dry.stdout.decode() + dry.stderr.decode(), re.M).group(1)
    return Path(here).resolve().parent


def _stub_libcuda(folder: Path, name: str) -> Path:
    """A driver stand-in (no driver here): a shared library with cuInit, as CUDA's lib64/stubs/libcuda.so."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "cuda_stub.c"
    source.write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    subprocess.run([CXX, "-shared", "-fPIC", "-x", "c", str(source), "-o", str(folder / name)], check=True)
    return folder / name


def _probe(tmp_path, **env):
    base = {
        k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "FLASHINFER_EXTRA_LDFLAGS")
    }
    env = {**base, "GPU_CHECK_CACHE": str(tmp_path / "cache"), "OUT": str(tmp_path / "out"), **env}
    start = time.monotonic()
    result = _run("probe", env=env)
    return result, time.monotonic() - start


def _driver_here() -> bool:
    return "libcuda.so" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout


@needs_nvcc
def test_the_probe_finds_the_real_cuda_home_and_links_as_flashinfer_does(tmp_path):
    # libcuda where the pip CUDA packages put theirs (nvidia/*/lib on sys.path), versioned only
    stub = _stub_libcuda(tmp_path / "site" / "nvidia" / "cu13" / "lib", "libcuda.so.1")
    result, seconds = _probe(tmp_path, PYTHONPATH=str(tmp_path / "site"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "link probe passed" in result.stdout and seconds < 60
    cache = tmp_path / "cache"
    env = (cache / "cuda.env").read_text()
    assert f"CUDA_HOME={_real_cuda_home()}" in env  # not the folder above a wrapper or a link named nvcc
    assert f"-L{cache / 'ld'}" in env and (cache / "ld" / "libcuda.so").resolve() == stub.resolve()


@needs_nvcc
def test_a_pip_toolkit_layout_without_lib64_links_through_a_versioned_copy(tmp_path):
    real = _real_cuda_home()
    cudart = next((p for d in ("lib64", "lib") for p in sorted((real / d).glob("libcudart.so.*"))), None)
    if cudart is None:
        pytest.skip("no libcudart.so.* beside this machine's nvcc")
    # the compiler and headers, and lib/libcudart.so.<major> alone: no lib64/, no unversioned copy (the pip
    # cuda-toolkit's layout); nvcc finds its headers from the folder it is called through
    home = tmp_path / "cuda"
    for part in ("bin", "nvvm", "include", "targets/x86_64-linux/include"):
        if (real / part).exists():
            (home / part).parent.mkdir(parents=True, exist_ok=True)
            (home / part).symlink_to(real / part)
    (home / "lib").mkdir()
    shutil.copy(cudart, home / "lib" / cudart.name)
    stubs = tmp_path / "stubs"
    _stub_libcuda(stubs, "libcuda.so")
    result, seconds = _probe(tmp_path, CUDA_HOME=str(home), FLASHINFER_EXTRA_LDFLAGS=f"-L{stubs}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        f"libcudart.so is not where FlashInfer links from: using {home / 'lib' / cudart.name}"
        in result.stdout
    )
    assert (tmp_path / "cache" / "ld" / "libcudart.so").resolve() == (home / "lib" / cudart.name).resolve()


@needs_nvcc
@pytest.mark.skipif(_driver_here(), reason="a libcuda is installed here: the probe cannot fail on it")
def test_the_probe_fails_in_seconds_with_one_line_when_the_link_cannot_succeed(tmp_path):
    result, seconds = _probe(tmp_path, PYTHONPATH="")
    assert result.returncode == 1 and seconds < 60
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("link probe FAILED in ")
    assert (
        "cannot find -lcuda" in lines[0]
        and "set CUDA_HOME or FLASHINFER_EXTRA_LDFLAGS=-L<folder>" in lines[0]
    )
    assert not (tmp_path / "cache" / "cuda.env").exists()
