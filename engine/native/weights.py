"""Checkpoint tensors (safetensors, sharded or not) → the native decoder's parameters, fused where it fuses them.

Names are transformers' (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, `score.weight`);
q/k/v are concatenated into `qkv_proj` and gate/up into `gate_up_proj`. A tensor the model needs and the
checkpoint lacks, or one of the wrong shape, is refused (never left random); tied embeddings reuse
the embedding matrix as the LM head.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from score_batch.engine.errors import ScoringInputError
from score_batch.engine.model.source import weight_files

BACKBONE_PREFIX = "model."
# Checkpoint names of each fused parameter's parts, in the order they are concatenated.
FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


class CheckpointReader:
    """Tensors by name across a checkpoint's shards, converted to a dtype and moved to a device on read."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device) -> None:
        from safetensors import safe_open

        self._dtype, self._device = dtype, device
        self._files = {}
        self._where: dict[str, object] = {}
        for path in weight_files(model_dir)[1]:  # model.safetensors, else the index's shards
            handle = safe_open(str(path), framework="pt", device="cpu")
            self._files[path] = handle
            for name in handle.keys():
                self._where[name] = handle

    def alias(self, name: str, source: str) -> None:
        """Read tensor `name` from `source` (a tied checkpoint that saved only its LM head)."""
        self._where[name] = _Renamed(self._where[source], source)

    def names(self) -> set[str]:
        """Every tensor name in the checkpoint."""
        return set(self._where)

    def has(self, name: str) -> bool:
        """Whether the checkpoint holds a tensor of this name."""
        return name in self._where

    def read(self, name: str) -> torch.Tensor:
        """One tensor in the model's dtype on the model's device."""
        return self._where[name].get_tensor(name).to(device=self._device, dtype=self._dtype)


class _Renamed:
    """A shard handle that answers get_tensor(any name) with one stored tensor."""

    def __init__(self, handle, source: str) -> None:
        self._handle, self._source = handle, source

    def get_tensor(self, name: str):
        return self._handle.get_tensor(self._source)


def _checkpoint_names(parameter: str, backbone_prefix: str) -> list[str]:
    """The checkpoint names a native parameter is read from (several for a fused one)."""
    module, _, leaf = parameter.rpartition(".")
    for fused, parts in FUSED.items():
        if module.endswith(fused):
            stem = module[: -len(fused)]
            return [f"{backbone_prefix}{stem}{part}.{leaf}" for part in parts]
    return [backbone_prefix + parameter]


def load_parameters(
    model: nn.Module,
    reader: CheckpointReader,
    backbone_prefix: str,
    head: tuple[nn.Module, str] | None,
    where: str,
) -> None:
    """Fill every parameter of the meta-built backbone (and the head) from the checkpoint, or refuse."""
    missing: list[str] = []
    for name, placeholder in list(model.named_parameters()):
        sources = _checkpoint_names(name, backbone_prefix)
        absent = [s for s in sources if not reader.has(s)]
        if absent:
            missing.extend(absent)
            continue
        parts = [reader.read(s) for s in sources]
        if any(part.shape[1:] != placeholder.shape[1:] for part in parts):  # cat would fail, unnamed
            found = ", ".join(f"{s} {tuple(p.shape)}" for s, p in zip(sources, parts))
            _refuse_shape(name, found, tuple(placeholder.shape), where)
        _assign(model, name, placeholder, torch.cat(parts) if len(parts) > 1 else parts[0], where)
    if head is not None:
        module, source = head
        if reader.has(source):
            _assign(module, "weight", module.weight, reader.read(source), where)
        else:
            missing.append(source)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ScoringInputError(
            f"the weight files of model {where!r} lack tensors the model needs ({shown}); "
            "they would be random: the checkpoint does not match its config.json or is incomplete"
        )


def _assign(root: nn.Module, name: str, placeholder: torch.Tensor, value: torch.Tensor, where: str) -> None:
    """Replace one placeholder parameter by the checkpoint's tensor of the same shape."""
    if tuple(value.shape) != tuple(placeholder.shape):
        _refuse_shape(name, str(tuple(value.shape)), tuple(placeholder.shape), where)
    module_name, _, leaf = name.rpartition(".")
    module = root.get_submodule(module_name) if module_name else root
    setattr(module, leaf, nn.Parameter(value, requires_grad=False))


def _refuse_shape(name: str, found: str, expected: tuple, where: str) -> None:
    """Refuse a checkpoint whose tensor for a parameter has the wrong shape."""
    raise ScoringInputError(
        f"the weight files of model {where!r} do not match its config.json: wrongly shaped tensors for "
        f"{name} ({found}; expected {expected} in all)"
    )


def backbone_prefix(reader: CheckpointReader) -> str:
    """'model.' for *ForCausalLM / *ForSequenceClassification checkpoints; '' for a bare backbone's."""
    return BACKBONE_PREFIX if any(name.startswith(BACKBONE_PREFIX) for name in reader.names()) else ""
