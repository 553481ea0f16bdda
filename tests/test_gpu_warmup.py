"""The GPU warm-up's JIT builds (bench/gpu.py build_specs), checked on the CPU with ninja and a stub compiler: every
module built at once, each in its own folder, so that a load there (FlashInfer's build_and_load runs ninja in
the module's folder) finds nothing to do; the one-ninja build it replaces left every module dirty there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402  (bench/gpu.py)

pytestmark = pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is not installed")

# A compiler standing in for nvcc and c++: `-MF DEPFILE ... -c SOURCE -o OUT` or `SOURCES... -o OUT` (link); it
# logs its start and end, writes its output and a depfile naming a header, and fails on a source named fail_*.cu.
COMPILER = """import json, sys, time
args = sys.argv[1:]
out = args[args.index("-o") + 1]
sources = [a for a in args if a.endswith((".cu", ".o"))]
start = time.time()
if any("fail_" in s for s in sources):
    sys.exit("error: stub compile failed")
if "--broken-link" in args:
    sys.exit("ld: cannot find -lcudart")
time.sleep(0.8)
open(out, "w").write("built from " + " ".join(sources))
if "-MF" in args:
    open(args[args.index("-MF") + 1], "w").write(out + ": " + sources[0] + " " + sys.argv[0] + "\\n")
with open(LOG, "a") as log:
    log.write(json.dumps([out, start, time.time()]) + "\\n")
"""


class NinjaSpec:
    """A module laid out as FlashInfer 0.6.6's JitSpec lays it out: `<jit dir>/<name>/build.ninja` with absolute
    object and library paths in that folder, gcc-style depfiles; build() runs ninja in that folder, as its
    JitSpec.build does (jit/cpp_ext.py run_ninja: `ninja -v -C build_dir -f build.ninja`), after writing
    build.ninja only where it is missing, from the environment of that moment (STUB_LDFLAGS: the link's flags),
    as 0.6.6's JitSpec.build does (jit/core.py)."""

    def __init__(self, jit_dir: Path, name: str, sources: list[Path], compiler: Path) -> None:
        self.name = name
        self.build_dir = jit_dir / name
        self.ninja_path = self.build_dir / "build.ninja"
        self.objects = [self.build_dir / source.with_suffix(".cuda.o").name for source in sources]
        self.build_dir.mkdir(parents=True)
        self._sources, self._compiler = sources, compiler
        self._write()

    def _write(self) -> None:
        sources, compiler, name = self._sources, self._compiler, self.name
        lines = [
            "ninja_required_version = 1.3",
            f"nvcc = {sys.executable} {compiler}",
            "rule cuda_compile",
            "  command = $nvcc -MF $out.d -c $in -o $out",
            "  depfile = $out.d",
            "  deps = gcc",
            "rule link",
            f"  command = $nvcc $in {os.environ.get('STUB_LDFLAGS', '')} -o $out",
        ]
        lines += [f"build {obj}: cuda_compile {source}" for obj, source in zip(self.objects, sources)]
        library = self.build_dir / f"{name}.so"
        lines += [f"build {library}: link {' '.join(map(str, self.objects))}", f"default {library}", ""]
        self.ninja_path.write_text("\n".join(lines))

    def build(self, verbose: bool, need_lock: bool = True) -> None:
        if not self.ninja_path.exists():
            self._write()
        command = ["ninja", "-v", "-C", str(self.build_dir), "-f", str(self.ninja_path)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError("Ninja build failed. Ninja output:\n" + done.stdout)


def _modules(tmp_path: Path, failing: str | None = None) -> dict[str, NinjaSpec]:
    """FlashInfer's five modules' shapes (objects per module as measured: FA2 and FA3 10, norm and rope 2)."""
    log = tmp_path / "compiles.jsonl"
    compiler = tmp_path / "stub_nvcc.py"
    compiler.write_text(f"LOG = {str(log)!r}\n" + COMPILER)
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    objects = {"fa2": 10, "norm": 2, "rope": 2, "silu_and_mul": 1}
    specs = {}
    for name, count in objects.items():
        sources = []
        for i in range(count):
            stem = f"fail_{name}{i}" if name == failing and i == 0 else f"{name}{i}"
            sources.append(csrc / f"{stem}.cu")
            sources[-1].write_text(f"// {name} {i}\n")
        specs[name] = NinjaSpec(tmp_path / "cached_ops", name, sources, compiler)
    return specs


def _compiles(tmp_path: Path) -> list[tuple[str, float, float]]:
    return [tuple(json.loads(line)) for line in (tmp_path / "compiles.jsonl").read_text().splitlines()]


def test_every_module_is_built_at_once_where_its_load_finds_nothing_to_do(tmp_path):
    specs = _modules(tmp_path)
    records = gpu.build_specs(specs)
    assert set(records) == set(specs)
    for name, record in records.items():
        assert "error" not in record and record["dirty_after"] == 0, (name, record)
    for spec in specs.values():  # what a load runs: ninja in the module's own folder compiles nothing
        done = subprocess.run(
            ["ninja", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)], capture_output=True
        )
        assert b"no work to do" in done.stdout
    compiles = _compiles(tmp_path)
    assert len(compiles) == sum(len(s.objects) + 1 for s in specs.values())  # each object and library once
    first_end = min(end for _, _, end in compiles)
    started_before = {Path(out).parent.name for out, start, _ in compiles if start < first_end}
    assert len(started_before) == len(specs)  # every module compiled before any compile had finished


def test_a_module_that_fails_is_recorded_and_the_others_are_built(tmp_path):
    records = gpu.build_specs(_modules(tmp_path, failing="norm"))
    assert (
        "Ninja build failed" in records["norm"]["error"] and "stub compile failed" in records["norm"]["error"]
    )
    assert records["norm"]["reset"]  # its build.ninja removed: a retry writes it again
    assert all(r["dirty_after"] == 0 and "error" not in r for n, r in records.items() if n != "norm")


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "0.6.6-alone"])
def test_a_build_whose_link_failed_succeeds_on_retry_once_the_environment_is_fixed(
    tmp_path, monkeypatch, reset
):
    monkeypatch.setenv("STUB_LDFLAGS", "--broken-link")  # a CUDA_HOME without lib64/, say
    specs = {"silu_and_mul": _modules(tmp_path)["silu_and_mul"]}
    if not reset:
        monkeypatch.setattr(gpu, "reset_failed_build", lambda spec: False)
    first = gpu.build_specs(specs)["silu_and_mul"]
    assert "cannot find -lcudart" in first["error"] and ("reset" in first) == reset
    compiled = len(_compiles(tmp_path))
    monkeypatch.setenv("STUB_LDFLAGS", "")  # the environment fixed
    second = gpu.build_specs(specs)["silu_and_mul"]
    if (
        reset
    ):  # build.ninja written again from the fixed environment; ninja's log keeps the object: a link alone
        assert "error" not in second and second["dirty_after"] == 0
        assert [Path(out).name for out, _, _ in _compiles(tmp_path)[compiled:]] == ["silu_and_mul.so"]
    else:  # FlashInfer 0.6.6 alone keeps the stale build.ninja: the link fails again
        assert "cannot find -lcudart" in second["error"]


def test_the_single_ninja_warm_up_it_replaces_left_every_module_dirty_where_it_loads(tmp_path):
    """FlashInfer's build_jit_specs: one ninja over a subninja per module, run from the JIT folder — its build
    log lives there, so each module's own folder has none and a load compiles the whole module again."""
    specs = _modules(tmp_path)
    jit_dir = tmp_path / "cached_ops"
    combined = jit_dir / "flashinfer_jit.ninja"
    combined.write_text(
        "ninja_required_version = 1.3\n" + "".join(f"subninja {s.ninja_path}\n" for s in specs.values())
    )
    subprocess.run(["ninja", "-C", str(jit_dir), "-f", str(combined)], check=True, capture_output=True)
    for spec in specs.values():
        steps, why = gpu.dirty_steps(spec)
        assert steps == len(spec.objects) + 1, spec.name  # every object and the library again
        assert any(line.endswith("are missing") or "not found in log" in line for line in why)  # no deps, log


class _Scorer:
    """What the warm-up calls need of a Scorer; a settings name in `failing` fails its first score."""

    def __init__(self, method, failing: set[str]) -> None:
        self.method, self.failing = method, failing

    def score(self, groups):
        if self.method.ops in self.failing or self.method.kernel in self.failing:
            raise RuntimeError(f"{self.method.kernel} with {self.method.ops} ops failed")
        return []


@pytest.mark.parametrize("failing", [set(), {"flashinfer"}, {"fa2"}], ids=["none", "ops", "fa2"])
def test_the_warm_up_records_its_modules_and_the_two_fa2_calls_apart(tmp_path, monkeypatch, failing):
    specs = _modules(tmp_path)
    used = []

    def scorer(model_dir, method, device, dtype, max_batch_tokens=None):
        used.append((method.kernel, method.layers, method.ops, device, dtype))
        return _Scorer(method, failing)

    monkeypatch.setattr(gpu, "jit_specs", lambda names: [specs[name] for name in names])
    monkeypatch.setattr(gpu, "jit_getters", lambda names: {})  # the specs build themselves
    monkeypatch.setattr(gpu, "_scorer", scorer)
    monkeypatch.setattr(gpu, "build_bench_model", lambda path, kind, **config: path)
    out = tmp_path / "warmup.json"
    out.write_text(json.dumps({"jit": {"fa3": {"seconds": 290.0}}, "calls": {"fa3": {"first_call_s": 1.0}}}))
    report = gpu.warmup(out, "fa2")
    assert report == json.loads(out.read_text())
    assert set(report["jit"]) == {"fa2", "norm", "rope", "silu_and_mul", "fa3"}  # an earlier FA3 record stays
    assert all(report["jit"][name]["dirty_after"] == 0 for name in gpu.JIT_BUILDS["fa2"])
    assert used == [
        ("fa2", "native", "torch", "cuda", "bfloat16"),
        ("fa2", "native", "flashinfer", "cuda", "bfloat16"),
    ]
    calls = report["calls"]
    assert ("error" in calls["fa2"]) == ("fa2" in failing)
    assert ("error" in calls["fa2-native-fi"]) == bool(failing)  # an ops failure is the ops' alone
    assert report["ok_fa2"] == ("fa2" not in failing)  # FA2's build and its torch-ops call decide
    assert gpu.main(["warmup", "--out", str(out)]) == (0 if "fa2" not in failing else 1)


# --- with FlashInfer itself (where it is installed and nvcc is here): a link that failed, then a retry ---------
RETRY = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import gpu
if sys.argv[2] == "0.6.6-alone":
    gpu.reset_failed_build = lambda spec: False
specs = dict(zip(["silu_and_mul"], gpu.jit_specs(["silu_and_mul"])))
if specs["silu_and_mul"].is_aot:
    sys.exit("silu_and_mul is prebuilt here (FlashInfer's AOT folder): it loads without a build")
getters = gpu.jit_getters(["silu_and_mul"])
print(json.dumps(gpu.build_specs(specs, getters)["silu_and_mul"]))
"""


def _flashinfer_and_nvcc() -> bool:
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None and shutil.which("nvcc") is not None


@pytest.mark.skipif(not _flashinfer_and_nvcc(), reason="needs flashinfer and nvcc (a real JIT build)")
@pytest.mark.parametrize("reset", ["reset", "0.6.6-alone"])
def test_flashinfers_own_build_whose_link_failed_succeeds_on_retry(tmp_path, reset):
    """silu_and_mul through FlashInfer's getter: the link fails (no libcuda here), build.ninja is removed; with
    FLASHINFER_EXTRA_LDFLAGS pointing at a libcuda the retry, in a fresh process, links without recompiling."""
    real = subprocess.run(
        ["nvcc", "--dryrun", "-x", "cu", "-c", "/dev/null", "-o", "/dev/null"], capture_output=True
    )
    here = next(line.split("=", 1)[1] for line in real.stderr.decode().splitlines() if "_HERE_=" in line)
    env = {k: v for k, v in os.environ.items() if k != "FLASHINFER_EXTRA_LDFLAGS"}
    env.update(
        CUDA_HOME=str(Path(here).resolve().parent),
        FLASHINFER_WORKSPACE_BASE=str(tmp_path / "ws"),
        FLASHINFER_CUDA_ARCH_LIST="9.0a",
        FLASHINFER_EXTRA_LDFLAGS="-L" + str(tmp_path / "no-libcuda-here"),
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    if "libcuda.so" in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout:
        pytest.skip("a libcuda is installed here: the first link cannot fail on it")
    command = [sys.executable, "-c", RETRY, str(ROOT), reset]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if "prebuilt here" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    first = json.loads(done.stdout.splitlines()[-1])
    assert "cannot find -lcuda" in first["error"] and ("reset" in first) == (reset == "reset")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "cuda_stub.c").write_text("int cuInit(unsigned int flags) { return (int)flags; }\n")
    subprocess.run(
        ["c++", "-shared", "-fPIC", "-x", "c", str(stubs / "cuda_stub.c"), "-o", str(stubs / "libcuda.so")]
    )
    env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stubs}"
    second = json.loads(
        subprocess.run(command, env=env, capture_output=True, text=True).stdout.splitlines()[-1]
    )
    print(first, second)
    if reset == "0.6.6-alone":  # the stale build.ninja keeps the old flags: the link fails again
        assert "cannot find -lcuda" in second["error"]
        return
    assert "error" not in second and second["dirty_after"] == 0, second
    assert second["seconds"] < first["seconds"] / 2  # the link alone: ninja's log kept the compiled objects


@pytest.mark.skipif(not _flashinfer_and_nvcc(), reason="needs flashinfer")
@pytest.mark.parametrize("kernel", ["fa2", "fa3"])
def test_the_warm_up_asks_the_installed_plan_for_its_module_arguments(monkeypatch, kernel):
    """plan_module_args runs score-batch's own plan path with FlashInfer's getter replaced by a recorder: on the
    CPU (host memory pinned without CUDA: the pin dropped) 0.6.6's plan() asks for exactly PLAN_ARGS_066's."""
    import jit_getters  # bench/jit_getters.py
    import torch

    empty = torch.empty

    def unpinned(*args, pin_memory=False, **kwargs):
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", unpinned)
    args = jit_getters.plan_module_args(kernel, torch.bfloat16, (16, 8), 128, "cpu")
    bf16 = torch.bfloat16
    assert args == (
        kernel,
        bf16,
        bf16,
        bf16,
        *jit_getters.PLAN_ARGS_066[:1],
        128,
        128,
        *jit_getters.PLAN_ARGS_066[1:],
    )


RESET = r"""
import json
from filelock import FileLock
from flashinfer.jit.core import get_tmpdir
from score_batch.engine.attention import flashinfer_jit

root = flashinfer_jit.jit_dir()
for name, files in {"failed": ["build.ninja"], "built": ["build.ninja", "built.so"], "busy": ["build.ninja"]}.items():
    (root / name).mkdir(parents=True)
    for file in files:
        (root / name / file).write_text("")
with FileLock(get_tmpdir() / "busy.lock", thread_local=False):  # another build holds it
    reset = flashinfer_jit.remove_failed_builds()
print(json.dumps({"reset": reset, "left": sorted(p.parent.name for p in root.glob("*/build.ninja"))}))
"""


@pytest.mark.skipif(not _flashinfer_and_nvcc(), reason="needs flashinfer")
def test_the_engine_resets_only_failed_builds_nobody_is_building(tmp_path):
    """remove_failed_builds (called after a kernel fails its load-time check): build.ninja goes from a module folder
    without its .so whose lock is free; a built module and one another process is building keep theirs."""
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(tmp_path), "FLASHINFER_CUDA_ARCH_LIST": "9.0a"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", RESET], env=env, capture_output=True, text=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"reset": ["failed"], "left": ["built", "busy"]}, (
        done.stderr
    )
