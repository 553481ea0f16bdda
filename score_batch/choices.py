"""Every choice a setting offers, declared once (torch-free): the CLI's options and --help, the configs that
check them, and the readers import them from here. Each tuple lists its Literal for checks and messages."""

from __future__ import annotations

from typing import Literal, get_args

ActivationChoice = Literal["auto", "none", "sigmoid", "softmax"]  # the `score` column's; auto as CrossEncoder
Backend = Literal[
    "auto", "flashinfer", "flashinfer-two-phase", "flex", "split", "sdpa"
]  # engine/attention/registry.py checks it
ChunkAggregate = Literal["max", "first", "mean"]
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["auto", "float32", "bfloat16", "float16", "fp8", "fp8-emulated"]  # fp8: engine/native/fp8.py
HiveTypes = Literal["infer", "string"]  # partition values typed (inferred) or kept as strings
LabelScore = Literal["probability", "logit", "sigmoid"]
Layers = Literal["auto", "native", "transformers"]
LogFormat = Literal["text", "json"]
OnError = Literal["fail", "record", "skip"]
Ops = Literal["auto", "torch", "flashinfer"]
Packing = Literal["auto", "mis", "single"]
# What a run asks for (RunConfig.input_format, --input-format): its input's own format (table: Parquet or
# JSONL rows), an OpenAI-style batch file, or auto (a batch file when its first request says so).
RequestedFormat = Literal["auto", "table", "openai-batch"]
Truncate = Literal["error", "item-tail", "query-head", "longest-first", "chunk"]

BACKENDS: tuple[str, ...] = get_args(Backend)
DTYPES: tuple[str, ...] = get_args(Dtype)
INPUT_FORMATS: tuple[str, ...] = get_args(RequestedFormat)
ON_ERROR_MODES: tuple[str, ...] = get_args(OnError)
