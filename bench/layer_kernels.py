"""Kernels launched per native decoder layer, counted on the CPU with the torch profiler.

The native layers run a multi-item pack through FlashInfer's paged prefill with TorchOps or FlashInferOps; the
FlashInfer kernels are stood in for by tests/flashinfer_stub.py (torch code that keeps FlashInfer 0.6.6's
contracts: 16-bit inputs, K/V strides equal, ...), each counted as one launch. Everything else counts as the
CUDA launches it would make: every top-level aten op that computes or copies (a GEMM, a copy, an add), views
not at all. A layer's count is a 2-layer model's minus a 1-layer model's, so the embedding, the final norm and
the plan stay out. With triton installed and TRITON_INTERPRET=1, FlashInferOps runs the fused q/k-norm + RoPE
kernel (engine/native/fused_qk.py) in Triton's interpreter, counted as one launch; its launch grid is recorded and
printed beside the goal shape's (a 5,601-token pack, Qwen3-0.6B's 16 + 8 heads) from the same grid rule.
`[TRITON_INTERPRET=1] python bench/layer_kernels.py [--families qwen3 llama]`
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/ holds the stub and models

from score_batch.engine.attention.flashinfer import FlashInferBackend  # noqa: E402
from score_batch.engine.model.source import weight_files  # noqa: E402
from score_batch.engine.native.load import load_native  # noqa: E402
from score_batch.engine.plan.batching import collate  # noqa: E402
from score_batch.engine.plan.packing import ItemRef, mis_pack  # noqa: E402
from tests import flashinfer_stub  # noqa: E402
from tests.tiny_models import build_model, build_tokenizer  # noqa: E402

# Ops that launch nothing themselves (views, allocation, dispatch wrappers): not counted, their children are.
TRANSPARENT = {
    "aten::" + name
    for name in (
        "view reshape _reshape_alias _unsafe_view contiguous to flatten transpose t permute split "
        "split_with_sizes chunk narrow slice select unsqueeze squeeze expand as_strided alias detach unbind "
        "view_as lift_fresh resolve_conj resolve_neg empty empty_like empty_strided"
    ).split()
}
KERNEL = "kernel::"  # the stub's FlashInfer kernels, one launch each
SHAPE = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128
)
GOAL_TOKENS, GOAL_HEADS = 5601, 16 + 8  # the goal shape's pack, Qwen3-0.6B's q + kv heads


def _kernel(name: str, function):
    @functools.wraps(function)
    def launch(*args, **kwargs):
        with torch.profiler.record_function(KERNEL + name):
            return function(*args, **kwargs)

    return launch


def fused_qk():
    """engine/native/fused_qk.py where it runs on CPU tensors (triton installed, TRITON_INTERPRET=1), else None."""
    try:
        from score_batch.engine.native import fused_qk as module
    except ImportError:
        return None
    return module if module.INTERPRETED else None


class Grids:
    """The fused kernel with each launch's (programs, tokens, heads) recorded."""

    def __init__(self, kernel) -> None:
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append((grid[0], args[5], args[8]))  # the kernel's tokens and q + kv heads arguments
            return self.kernel[grid](*args, **kwargs)

        return launch


def programs_line(fused, seen: list) -> str:
    """The fused kernel's programs per launch, here and at the goal shape, beside one per (token, head)."""
    programs, tokens, heads = seen[-1]
    goal = fused.programs(GOAL_TOKENS)
    return (
        f"{'':17} fused q/k-norm + RoPE: {programs} programs per launch for {tokens} tokens × {heads} heads "
        f"({tokens * heads} at one per (token, head)); at the goal shape {goal:,} ({GOAL_TOKENS * GOAL_HEADS:,})"
    )


def launches(events) -> Counter:
    """Counted launches by name: kernel:: ranges and top-level non-view aten ops (nothing under a counted one)."""
    counted: Counter = Counter()
    for event in events:
        if (
            not (event.name.startswith(KERNEL) or event.name.startswith("aten::"))
            or event.name in TRANSPARENT
        ):
            continue
        parent, inside = event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith(KERNEL) or (
                parent.name.startswith("aten::") and parent.name not in TRANSPARENT
            ):
                inside = True
                break
            parent = parent.cpu_parent
        if not inside:
            counted[event.name] += 1
    return counted


def count(model_dir: Path, ops: str) -> Counter:
    """Launches of one forward of the model over a multi-item pack, FlashInfer's prefill (the stub) attending."""
    cpu = torch.device("cpu")
    pack = mis_pack(list(range(5, 35)), [[40, 41, 42], [43], [44, 45]], [ItemRef(0, i) for i in range(3)], 3)
    batch = collate([pack])
    paths = weight_files(model_dir)[1]
    backbone, _, _ = load_native(model_dir, paths, "causal", 0, torch.bfloat16, cpu, ops, False)
    plan = FlashInferBackend(cpu).plan(batch, cpu)
    args = (
        torch.from_numpy(batch.token_ids),
        torch.from_numpy(batch.positions),
        int(batch.positions.max()),
        plan,
        torch.from_numpy(batch.score_rows),
    )
    with torch.inference_mode():
        backbone(*args)  # the plan's first layer plans; not counted
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            backbone(*args)
    return launches(prof.events())


def per_layer(family: str, ops: str, root: Path) -> Counter:
    """Launches of one decoder layer: a 2-layer model's minus a 1-layer model's."""
    counts = []
    for layers in (1, 2):
        path = root / f"{family}-{layers}"
        if not path.exists():
            tokenizer = build_tokenizer(path)
            build_model(path, family, "causal", len(tokenizer), num_hidden_layers=layers, **SHAPE)
        counts.append(count(path, ops))
    return counts[1] - counts[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=["qwen3", "llama"])
    args = parser.parse_args(argv)
    patch = pytest.MonkeyPatch()
    stub = flashinfer_stub.FlashInferStub()
    for name in ("rmsnorm", "fused_add_rmsnorm", "rope", "silu_and_mul"):
        setattr(stub, name, _kernel(name, getattr(stub, name)))
    patch.setattr(flashinfer_stub._PagedPrefill, "run", _kernel("prefill", flashinfer_stub._PagedPrefill.run))
    fused = fused_qk()
    if fused is not None:  # TRITON_INTERPRET=1 with triton: the fused q/k-norm + RoPE kernel, one launch
        patch.setattr(fused, "qk_norm_rope", _kernel("qk_norm_rope", fused.qk_norm_rope))
        grids = Grids(fused._qk_norm_rope)
        patch.setattr(fused, "_qk_norm_rope", grids)
    stub.install(patch)
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for family in args.families:
                for ops in ("torch", "flashinfer"):
                    layer = per_layer(family, ops, Path(tmp))
                    names = ", ".join(f"{n.split('::')[1]}×{c}" for n, c in sorted(layer.items()))
                    print(f"{family:6} {ops:10} {sum(layer.values()):3} per layer: {names}")
                    if fused is not None and ops == "flashinfer" and grids.seen:
                        print(programs_line(fused, grids.seen))
    finally:
        patch.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
