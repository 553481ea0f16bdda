"""FlashInfer's own module getters for the GPU check's warm-up (bench/gpu.py): get_batch_prefill_module with
the arguments the installed plan() derives, get_norm_module, get_rope_module and get_act_and_mul_module build
and load exactly the module a later call of the engine loads, whichever FlashInfer version is installed:
plan_module_args() asks the installed plan() for its arguments instead of repeating them."""

from __future__ import annotations

import torch

# What 0.6.6's plan() passes to get_batch_prefill_module for our calls after the backend: q, kv, o dtypes, the
# indptr dtype, head_dim qk and vo, PosEncodingMode.NONE, no sliding window, no soft cap, no fp16 qk reduction.
PLAN_ARGS_066 = (torch.int32, 0, False, False, False)


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
