"""Checks of the GPU install (bench/gpu_check.sh install): the carried wheels against the image, and `pip check`.

python bench/install_check.py wheels DIR          each carried wheel's requirements are in the image,
                                                  carried, or knowingly left out (exit 1 otherwise)
python bench/install_check.py pip-check BEFORE AFTER   `pip check` after the install reports nothing
                                                  that was not there before, but the known omissions
python bench/install_check.py fa3 WARMUP_JSON     prints why FA3 may not run yet (nothing when warmup.json
                                                  holds its build time and a successful call)
python bench/install_check.py merge OUT RECORD...  warm-up records merged into OUT (missing ones left out)
"""

from __future__ import annotations

import json
import re
import sys
import zipfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# flashinfer-python 0.6.6 requires these for its cuDNN and CuTe-DSL backends only (≈200 MB): not carried.
LEFT_OUT = frozenset({"nvidia-cudnn-frontend", "nvidia-cutlass-dsl"})
NO_DEPS = "flashinfer-python"  # installed with --no-deps because of LEFT_OUT; the rest resolve normally
# Requires-Dist of the flashinfer_python-0.6.6 wheel's METADATA (for checks without the wheel at hand).
FLASHINFER_066_REQUIRES = (
    "apache-tvm-ffi!=0.1.8,!=0.1.8.post0,<0.2,>=0.1.6",
    "click",
    "einops",
    "ninja",
    "numpy",
    "nvidia-cudnn-frontend>=1.13.0",
    "nvidia-cutlass-dsl>=4.3.4",
    "nvidia-ml-py",
    "packaging>=24.2",
    "requests",
    "tabulate",
    "torch",
    "tqdm",
)
APACHE_TVM_FFI_REQUIRES = ("typing-extensions>=4.13",)  # 0.1.15.post2, extras left out


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of - _ . as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The project name of a requirement string ("packaging>=24.2" → "packaging")."""
    return normalize(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def listed_names(path: Path) -> list[str]:
    """Project names of a list file (requirements or whitespace-separated names; # comments)."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0]
        names += [requirement_name(word) for word in line.split()]
    return names


def wheel_requires(wheel: Path) -> tuple[str, list[str]]:
    """(project name, requirements without extras) from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode()
    name = normalize(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    requires = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    return name, [r.split(";", 1)[0].strip() for r in requires]


def unmet(requires: dict[str, list[str]], image: set[str]) -> dict[str, list[str]]:
    """Per carried project, its required names neither in the image, nor carried, nor knowingly left out."""
    carried = set(requires)
    return {
        project: missing
        for project, reqs in requires.items()
        if (missing := sorted({requirement_name(r) for r in reqs} - image - carried - LEFT_OUT))
    }


def new_problems(before: str, after: str) -> list[str]:
    """`pip check` lines after the install that were not there before, less the known omissions."""
    seen = set(before.splitlines())
    left_out = re.compile(rf"^{NO_DEPS} [^ ]+ requires ({'|'.join(sorted(LEFT_OUT))}),", re.I)
    return [
        line
        for line in after.splitlines()
        if line.strip()
        and line not in seen
        and not left_out.match(line)
        and not line.startswith("No broken requirements")
    ]


def fa3_unproven(warmup: dict | None) -> str | None:
    """Why FA3 may not run: None only when a warm-up recorded FA3's build time without an error and a successful
    first call (bench/gpu.py warmup --fa3); tests/gpu skip FA3 and the bench refuses it otherwise."""
    if warmup is None:
        return (
            "no FA3 record on this machine: FA3 was never built here (bash bench/gpu_check.sh all builds it)"
        )
    build, call = warmup.get("jit", {}).get("fa3", {}), warmup.get("calls", {}).get("fa3", {})
    if "error" in build:
        return f"FA3 did not build in the warm-up (warmup.json): {build['error'][-300:]}"
    if "skipped" in build:
        return f"FA3 was not built: {build['skipped']}"
    if "seconds" not in build:
        return "FA3 is not built on this machine (bash bench/gpu_check.sh all builds it)"
    if "first_call_s" not in call:
        why = call.get("error", "no call recorded")[-300:]
        return f"FA3 built in {build['seconds']} s but its warm-up call did not succeed: {why}"
    return None


def merge_records(out: Path, records: list[Path]) -> None:
    """Warm-up records (bench/gpu.py warmup --out) merged into `out`: their per-module dicts joined, later ones
    winning; records that do not exist are left out, and nothing is written when none does."""
    merged: dict = {}
    for path in records:
        if not path.exists():
            continue
        for key, value in json.loads(path.read_text()).items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    if merged:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(merged, indent=2) + "\n")


def main(argv: list[str]) -> int:
    if argv[:1] == ["wheels"] and len(argv) == 2:
        wheels = sorted(Path(argv[1]).glob("*.whl"))
        requires = dict(wheel_requires(w) for w in wheels)
        image = set(listed_names(BENCH / "gpu_image.txt"))
        expected = set(listed_names(BENCH / "gpu_wheels.txt"))
        problems = []
        if set(requires) != expected:
            problems.append(f"carried {sorted(requires)} but bench/gpu_wheels.txt lists {sorted(expected)}")
        problems += [
            f"{p} needs {', '.join(m)}: not in the image, not carried"
            for p, m in unmet(requires, image).items()
        ]
        for line in problems:
            print(f"install_check: {line}", file=sys.stderr)
        print(f"install_check: {len(wheels)} wheels, {'problems' if problems else 'requirements covered'}")
        return 1 if problems else 0
    if argv[:1] == ["pip-check"] and len(argv) == 3:
        problems = new_problems(Path(argv[1]).read_text(), Path(argv[2]).read_text())
        for line in problems:
            print(f"pip check after the install: {line}", file=sys.stderr)
        print(
            f"install_check: pip check {'FAILED' if problems else 'clean'} (known omissions: {', '.join(sorted(LEFT_OUT))})"
        )
        return 1 if problems else 0
    if argv[:1] == ["fa3"] and len(argv) == 2:
        path = Path(argv[1])
        why = fa3_unproven(json.loads(path.read_text()) if path.exists() else None)
        print(why or "", end="\n" if why else "")
        return 0
    if argv[:1] == ["merge"] and len(argv) >= 3:
        merge_records(Path(argv[1]), [Path(a) for a in argv[2:]])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
