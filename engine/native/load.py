"""Build a native decoder and its score head from a model directory: config, meta-built modules, checkpoint tensors."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from score_batch.engine.native.config import model_config
from score_batch.engine.native.layers import Linear, NativeDecoder
from score_batch.engine.native.ops import make_ops
from score_batch.engine.native.rope import RopeCache, inverse_frequencies
from score_batch.engine.native.spec import DecoderSpec, decoder_spec
from score_batch.engine.native.weights import CheckpointReader, backbone_prefix, load_parameters

log = logging.getLogger(__name__)


def _ties(reader: CheckpointReader, prefix: str, model_dir: Path) -> bool:
    """Whether a tie_word_embeddings checkpoint's LM head is its embedding matrix, as transformers decides it:
    an lm_head.weight that differs from the embeddings is kept as the head (with a warning)."""
    embedding = prefix + "embed_tokens.weight"
    if reader.has("lm_head.weight") and not reader.has(embedding):
        reader.alias(embedding, "lm_head.weight")  # transformers ties the embeddings to the saved head
        return True
    if not reader.has("lm_head.weight") or torch.equal(reader.read("lm_head.weight"), reader.read(embedding)):
        return True
    log.warning(
        "%s: tie_word_embeddings is set but lm_head.weight differs from the embeddings; the checkpoint's "
        "lm_head.weight is used as the head, as transformers does",
        model_dir,
    )
    return False


def load_native(
    model_dir: Path,
    weight_paths: Sequence[Path],
    kind: str,
    num_labels: int,
    dtype: torch.dtype,
    device: torch.device,
    ops_name: str,
    trust_remote_code: bool,
) -> tuple[NativeDecoder, Linear, DecoderSpec]:
    """(backbone, head, spec): the head is the LM head (kind 'causal') or the classifier's `score`;
    weight_paths are the directory's safetensors files (model.safetensors, else the index's shards)."""
    config = model_config(model_dir, trust_remote_code)
    spec = decoder_spec(config)
    inv_freq, scaling = inverse_frequencies(config, spec.head_dim)
    ops = make_ops(ops_name, device)
    rope = RopeCache(inv_freq, scaling, device)
    backbone = NativeDecoder(spec, ops, rope)  # meta placeholders, each replaced by a checkpoint tensor
    head = Linear(spec.hidden_size, spec.vocab_size if kind == "causal" else num_labels, bias=False)
    reader = CheckpointReader(weight_paths, dtype, device)
    prefix = backbone_prefix(reader)
    tied = kind == "causal" and spec.tie_word_embeddings and _ties(reader, prefix, model_dir)
    head_source = None if tied else ("lm_head.weight" if kind == "causal" else "score.weight")
    load_parameters(backbone, reader, prefix, None if tied else (head, head_source), str(model_dir))
    if tied:
        head.weight = backbone.embed_tokens.weight
    backbone.eval()
    head.eval()
    log.debug(
        "native %s layers: %d, ops %s, rope %s", spec.model_type, spec.num_layers, ops.name, spec.rope_type
    )
    return backbone, head, spec
