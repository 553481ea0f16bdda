"""FlashInfer's JIT modules: built through FlashInfer's own getters, and a failed build left ready for a retry.

The getters (get_batch_prefill_module with the arguments plan() derives, get_norm_module, get_rope_module,
get_act_and_mul_module) build and load exactly the module a later call loads, whichever FlashInfer version is
installed: plan_module_args() asks the installed plan() for its arguments instead of repeating them.
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

import torch

DISABLE_JIT = "FLASHINFER_DISABLE_JIT"  # FlashInfer: a module not prebuilt raises at once instead of building

# What 0.6.6's plan() passes to get_batch_prefill_module for our calls after the backend: q, kv, o dtypes, the
# indptr dtype, head_dim qk and vo, PosEncodingMode.NONE, no sliding window, no soft cap, no fp16 qk reduction.
PLAN_ARGS_066 = (torch.int32, 0, False, False, False)


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


class _Derived(Exception):
    """Raised by the recording getter: plan() has derived its module arguments, nothing more is needed."""


def plan_module_args(kernel: str, dtype: torch.dtype, heads: tuple[int, int], head_dim: int, device) -> tuple:
    """(backend, *args) that the installed FlashInfer's paged plan() passes to get_batch_prefill_module for a
    multi-item plan of ours (score-batch's own plan path, its getter replaced by a recorder for the call)."""
    import flashinfer.prefill as prefill

    from score_batch.engine.attention.flashinfer import FlashInferPlan
    from score_batch.engine.attention.flashinfer_plan import MultiItemMetadata

    seen: list[tuple] = []

    def record(backend, *args):
        seen.append((backend, *args))
        raise _Derived

    meta = MultiItemMetadata(  # one pack: a 2-token query, a delimiter, a 1-token item
        qo_indptr=_ints([0, 4]),
        kv_indices=_ints([0, 1, 2, 3]),
        kv_last_page_len=_ints([1]),
        prefix_len=_ints([2], "uint32"),
        token_pos_in_items=_ints([0, 1], "uint16"),
        token_pos_in_items_len=2,
        max_item_len=_ints([1], "uint16"),
    )
    workspace = torch.empty(1 << 20, dtype=torch.uint8, device=device)
    wrapper = _wrapper(workspace, kernel)
    plan = FlashInferPlan(wrapper, meta, torch.device(device))
    query = torch.empty(1, heads[0], 4, head_dim, dtype=dtype, device=device)  # [1, heads, tokens, head_dim]
    key = torch.empty(1, heads[1], 4, head_dim, dtype=dtype, device=device)
    original = prefill.get_batch_prefill_module
    prefill.get_batch_prefill_module = record
    try:
        plan._plan(query, key, None)
    except _Derived:
        pass
    finally:
        prefill.get_batch_prefill_module = original
    if not seen:
        raise RuntimeError("FlashInfer's plan() did not ask get_batch_prefill_module for a module")
    return seen[0]


def _ints(values, dtype: str = "int32"):
    import numpy as np

    return np.asarray(values, dtype=dtype)


def _wrapper(workspace: torch.Tensor, kernel: str):
    import flashinfer

    return flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD", backend=kernel)


def module_getters(
    names, dtype: torch.dtype = torch.bfloat16, heads=(16, 8), head_dim: int = 128, device="cuda"
):
    """name → a call of FlashInfer's own getter that builds and loads the module score-batch's calls load:
    "fa2"/"fa3" the paged prefill with the arguments plan() derives (0.6.6's when plan() cannot run here),
    "norm", "rope", "silu_and_mul" the native layers' ops."""
    import flashinfer.activation
    import flashinfer.norm
    import flashinfer.prefill
    import flashinfer.rope

    def prefill(kernel: str):
        try:
            args = plan_module_args(kernel, dtype, heads, head_dim, device)
        except Exception:  # e.g. no CUDA here (the wrapper pins host memory): what 0.6.6's plan() derives
            args = (kernel, dtype, dtype, dtype, PLAN_ARGS_066[0], head_dim, head_dim, *PLAN_ARGS_066[1:])
        return lambda: flashinfer.prefill.get_batch_prefill_module(*args)

    make = {
        "norm": lambda: flashinfer.norm.get_norm_module,
        "rope": lambda: flashinfer.rope.get_rope_module,
        "silu_and_mul": lambda: lambda: flashinfer.activation.get_act_and_mul_module("silu"),
        "fa2": lambda: prefill("fa2"),
        "fa3": lambda: prefill("fa3"),
    }
    return {name: make[name]() for name in names}


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
