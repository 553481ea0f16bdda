"""The `models` command: what the engine runs, how it packs each kind of model, and the built-in profiles."""

from __future__ import annotations

from typing import Annotated

import typer

from score_batch.cli.error_messages import user_message
from score_batch.errors import UserError

# (models, heads, packing, notes): what the tests cover, family by family.
SUPPORTED = [
    ("Llama, Qwen2, Qwen3, Mistral (decoders, native layers)",
     "ForCausalLM, ForSequenceClassification (reward: num_labels 1)", "mis, single",
     "our own fused decoder layers (--layers); sliding windows applied on reference positions"),
    ("Gemma, Phi3 (decoders)", "ForCausalLM, ForSequenceClassification (reward: num_labels 1)", "mis, single",
     "transformers' layers with our attention"),
    ("Gemma2 (decoder)", "ForCausalLM, ForSequenceClassification", "mis, single",
     "attention and final-logit soft-capping; backends sdpa, split, flex"),
    ("other decoders using transformers' attention interface", "ForCausalLM, ForSequenceClassification",
     "mis, single", "checked against plain HF only for the families above"),
    ("recurrent / linear-attention / hybrid (Mamba, Jamba, Qwen3-Next, RWKV, …)",
     "ForCausalLM, ForSequenceClassification", "single", "state would leak between packed items"),
    ("encoders: BERT, XLM-RoBERTa, ModernBERT (tested); RoBERTa, DeBERTa, DistilBERT, ELECTRA, MPNet, …",
     "ForSequenceClassification (cross-encoders)", "single (pairs)",
     "tokenizer(query, item), padded length-sorted batches; pooled = last hidden state at CLS (or the mean)"),
    ("encoder-decoders (T5, BART, …)", "—", "refused", ""),
]  # fmt: skip


def models(
    model: Annotated[
        str | None,
        typer.Option(help="Also describe this model (a local directory or a cached hub id)."),
    ] = None,
) -> None:
    """Print the supported families and the built-in profiles (and describe --model)."""
    from rich.console import Console
    from rich.table import Table

    from score_batch.engine.model.profiles import builtin_profiles

    console = Console()
    families = Table("models", "heads", "packing", "notes", title="Supported models", show_lines=True)
    for row in SUPPORTED:
        families.add_row(*row)
    console.print(families)
    profiles = Table(
        "name", "picked automatically for", "description", title="Built-in profiles (--profile NAME)"
    )
    for name, profile in builtin_profiles().items():
        profiles.add_row(name, "\n".join(profile.models) or "—", profile.description)
    console.print(profiles)
    if model:
        console.print(_describe(model))


def _describe(model: str) -> str:
    """One model's architecture, kind, allowed packing and profile, or why it cannot run."""
    from score_batch.engine.model.kind import read_model_kind
    from score_batch.engine.model.profiles import choose_profile
    from score_batch.engine.model.source import resolve_model_dir

    try:
        path = resolve_model_dir(model)
        info = read_model_kind(path)
        profile = choose_profile(None, model, path)
    except UserError as error:
        raise typer.BadParameter(user_message(error), param_hint="--model") from None
    lines = [
        f"[bold]{model}[/bold] → {path}",
        f"  {info.architecture} ({info.model_type}), {info.kind}{', encoder' if info.encoder else ''}",
        f"  packing: {', '.join(info.packings)} (auto picks {info.packings[0]})",
        f"  profile: {f'{profile.name} ({profile.source})' if profile else 'none: give labels/templates as flags'}",
    ]
    if info.mis_refusal:
        lines.append(f"  why not mis: {info.mis_refusal}")
    lines.append(f"  decoder layers: {_layers(path, info)}")
    return "\n".join(lines)


def _layers(path, info) -> str:
    """Whose decoder layers `--layers auto` runs, from config.json alone (transformers' defaults fill the rest at run time)."""
    import json
    from types import SimpleNamespace

    from score_batch.engine.native.spec import native_refusal

    if info.encoder:
        return "transformers' (an encoder runs as padded pairs)"
    raw = json.loads((path / "config.json").read_text(encoding="utf-8"))
    refusal = native_refusal(SimpleNamespace(**raw), info.architecture, trust_remote_code=False)
    return "native (engine/native)" if refusal is None else f"transformers' ({refusal})"
