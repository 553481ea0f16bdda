"""FlashInfer's JIT at load time: DISABLE_JIT where no compiler is found, and a failed build left ready for a
retry (the warm-up's getters, which build each module ahead of a run, are bench/jit_getters.py).

FlashInfer 0.6.6 writes a module's build.ninja only when it does not exist (jit/core.py), so a build whose link
failed keeps failing after the environment is fixed (CUDA_HOME, FLASHINFER_EXTRA_LDFLAGS): remove_failed_builds()
removes the build.ninja of every module folder left without its .so, and ninja's own log then recompiles only the
objects whose command changed. Imported only where flashinfer is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

DISABLE_JIT = "FLASHINFER_DISABLE_JIT"  # FlashInfer: a module not prebuilt raises at once instead of building


def jit_compiler() -> str | None:
    """The nvcc FlashInfer's JIT would run, as 0.6.6 finds it: FLASHINFER_NVCC, else CUDA_HOME's (or
    CUDA_PATH's) bin/nvcc, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; None when it does not exist."""
    if os.environ.get("FLASHINFER_NVCC"):
        return shutil.which(os.environ["FLASHINFER_NVCC"])
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = (
        [os.path.join(home, "bin", "nvcc")] if home else [shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"]
    )
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@contextlib.contextmanager
def jit_disabled_without_compiler(active: bool = True):
    """FLASHINFER_DISABLE_JIT=1 inside the block when `active`, no compiler is found and the user set nothing:
    a module missing from FlashInfer's prebuilt kernels (flashinfer-jit-cache, or modules in its AOT folder) then
    fails at once (MissingJITCacheError), where a build would fail after a search for nvcc. Yields whether it set
    the variable; restored after the block."""
    set_here = active and DISABLE_JIT not in os.environ and jit_compiler() is None
    if set_here:
        os.environ[DISABLE_JIT] = "1"
    try:
        yield set_here
    finally:
        if set_here:
            os.environ.pop(DISABLE_JIT, None)


def jit_dir() -> Path:
    """FlashInfer's JIT folder (one subfolder per module: build.ninja, objects, <module>.so)."""
    from flashinfer.jit import env

    return Path(env.FLASHINFER_JIT_DIR)


def remove_failed_builds() -> list[str]:
    """Remove build.ninja from each module folder that has one but no <module>.so (a failed or cut build) and
    whose build lock is free (no process is building it): the next build writes it again from the environment
    it runs in. Harmless for a module never built. Returns the modules reset."""
    from filelock import FileLock, Timeout
    from flashinfer.jit.core import get_tmpdir

    reset = []
    root = jit_dir()
    for ninja in sorted(root.glob("*/build.ninja")) if root.exists() else []:
        folder = ninja.parent
        name = folder.name
        if (folder / f"{name}.so").exists():
            continue
        try:
            with FileLock(get_tmpdir() / f"{name}.lock", thread_local=False, timeout=0):
                ninja.unlink(missing_ok=True)
        except Timeout:  # another process is building it
            continue
        reset.append(name)
    return reset
