"""Compiled decoder layers around attention (EngineConfig.compile).

torch.compile fuses the element-wise work of every decoder layer: the RMSNorms and the SiLU·mul of the
MLP, and inside the attention module the q/k norms and RoPE with their projections. Attention itself is
not traced: our AttentionInterface function takes a per-batch plan object, so the attention module's
compiled forward breaks its graph exactly at the plan's `attend` (see OpaquePlan) and resumes after it.

Whole decoder layers are not compiled: a layer calls attention, and dynamo would guard on the plan object
passed down as a keyword (compilable_modules names the pieces that are).

Token counts: the token dimension (dim 1 of our [1, tokens, …] forward) is marked dynamic, so one graph
serves every batch size (the attention module's resume graph turns dynamic at the second size). Padding
to flex's token buckets with static shapes was measured and rejected: every bucket compiles each module
kind again and the shared RMSNorm code reaches dynamo's recompile limit (8) after four buckets, after
which it silently runs eager; and on CPU it was slower than eager (padding copies), where dynamic was faster.
Modules of the same class share their graphs (dynamo treats their parameters as inputs).

torch._dynamo (about 1.7 s to import) is imported only when compilation is asked for: by compile_backbone
and by the first OpaquePlan.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

TOKEN_DIM = 1  # [1, tokens, hidden] hidden states, [1, tokens, head_dim] RoPE tables, [1, tokens] positions
MLP_NAMES = ("mlp", "feed_forward")
ATTENTION_NAMES = ("self_attn", "attn", "self_attention", "attention")
FINAL_NORM_NAMES = ("norm", "final_layernorm", "final_norm")


def _is_norm(module: nn.Module) -> bool:
    """A leaf normalization module (RMSNorm, LayerNorm): row-wise over the last dimension."""
    return "norm" in type(module).__name__.lower() and next(module.children(), None) is None


def _is_dense_mlp(name: str, module: nn.Module) -> bool:
    """A dense MLP (not a mixture of experts, whose routing depends on the data)."""
    cls = type(module).__name__
    return name in MLP_NAMES and cls.endswith("MLP") and "moe" not in cls.lower()


def compilable_modules(backbone: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each decoder layer's norms, dense MLP and attention module, and the final norm."""
    found: list[tuple[str, nn.Module]] = []
    for index, layer in enumerate(getattr(backbone, "layers", None) or ()):
        for name, child in layer.named_children():
            if _is_norm(child) or _is_dense_mlp(name, child) or name in ATTENTION_NAMES:
                found.append((f"layers.{index}.{name}", child))
    for name in FINAL_NORM_NAMES:
        module = getattr(backbone, name, None)
        if isinstance(module, nn.Module) and _is_norm(module):
            found.append((name, module))
    return found


def _token_dynamic(compiled, token_dim: int):
    """The module's new forward: its tensor inputs' token dimension marked dynamic, then the compiled forward."""

    def forward(*args, **kwargs):
        for value in (*args, *kwargs.values()):
            for tensor in value if isinstance(value, tuple) else (value,):  # position_embeddings = (cos, sin)
                if isinstance(tensor, torch.Tensor) and tensor.dim() > token_dim:
                    torch._dynamo.maybe_mark_dynamic(tensor, token_dim)
        return compiled(*args, **kwargs)

    return forward


def compile_backbone(backbone: nn.Module, token_dim: int = TOKEN_DIM) -> list[str]:
    """Compile the backbone's norms, dense MLPs and attention modules in place; their names. token_dim: 1 for
    transformers' [1, tokens, …] tensors, 0 for the native layers' [tokens, …]."""
    modules = compilable_modules(backbone)
    for _, module in modules:
        # The bound eager forward, compiled; the instance's forward attribute then shadows the class's.
        module.forward = _token_dynamic(torch.compile(module.forward), token_dim)
    return [name for name, _ in modules]


class OpaquePlan:
    """A batch's attention plan whose `attend` dynamo never traces: the compiled graph breaks there. Only the
    type is guarded, so a new plan per batch compiles nothing new. Functions compiled on their own inside
    attend (compiled flex_attention) still run compiled. Instances are of a subclass made on first use, whose
    attend is wrapped by torch.compiler.disable (that import is what waits until then)."""

    def __new__(cls, plan) -> OpaquePlan:
        return object.__new__(_untraced_plan_class())

    def __init__(self, plan) -> None:
        self.plan = plan

    def attend(self, query, key, value, scaling, sliding_window, softcap=None, **keywords):
        """The wrapped plan's attend, run eagerly; keywords (the decoder layer's `layer`) are passed on as given."""
        return self.plan.attend(query, key, value, scaling, sliding_window, softcap, **keywords)


@functools.cache
def _untraced_plan_class() -> type[OpaquePlan]:
    """OpaquePlan's subclass whose attend dynamo skips (imports torch._dynamo, once)."""

    class UntracedPlan(OpaquePlan):
        attend = torch.compiler.disable(OpaquePlan.attend)

    return UntracedPlan
