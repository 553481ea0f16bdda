"""The `score` command: its flags, and the mapping from flags to one RunConfig (no business logic here)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from score_batch.cli.flags import comma_ints, comma_list
from score_batch.cli.logs import setup_logging
from score_batch.engine.config import EngineConfig
from score_batch.engine.model_source import resolve_model_dir
from score_batch.engine.profiles import choose_profile, scoring_config
from score_batch.io_formats.locations import parse_storage_options, split_inputs
from score_batch.io_formats.schema import ColumnOverrides
from score_batch.job.config import DEFAULT_WINDOW_ROWS, RayOptions, RunConfig

from score_batch import job
from score_batch.demo import demo_model_path

DEMO_MODEL_DIR = Path(demo_model_path())  # package data: found from a wheel too
COLUMNS = "Input columns"
SCORING = "Scoring"
ENGINE = "Engine"
JOB = "Batch job"
RAY = "Scale-out on Ray (pip install -e '.\\[ray]')"
HELP = (
    "Score every (query, item) pair of INPUT with a local Hugging Face model and write one score per pair.\n\n"
    "Each query is packed with all of its items into one sequence (multi-item scoring), so the query is "
    "computed once; every score equals a separate query+item forward pass.\n\n"
    "[bold]Examples[/bold]\n\n"
    "  score-batch sample_data/products.parquet -o scores.parquet            [dim]# demo model[/dim]\n\n"
    "  cat pairs.jsonl | score-batch - -o - --model ./my-reranker --label-tokens ' no' --label-tokens ' yes'\n\n"
    "  score-batch big/ -o out.parquet --model ./rm --resume --on-error record --report run.json\n\n"
    "  score-batch data.parquet -o out.parquet --model Qwen/Qwen3-Reranker-0.6B   [dim]# from the HF cache, built-in profile[/dim]\n\n"
    "  score-batch models            [dim]# supported models, packing, built-in profiles[/dim]"
)


def score(
    input: Annotated[
        list[str],
        typer.Argument(
            help="One or more inputs, read in order: .parquet, .jsonl, .jsonl.gz or .jsonl.zst files, directories "
            "(with key=value partition directories) or globs; local paths or file://, s3://, gs://, https://, "
            "hf:// URIs; or - (JSONL on stdin). One argument may list several, separated by commas.",
            show_default=False,
        ),
    ],
    output: Annotated[
        str,
        typer.Option(
            "-o",
            "--output",
            help="A .parquet or .jsonl path (local, file://, s3://, gs://), or - for JSONL on stdout.",
        ),
    ] = "scores.parquet",
    storage_option: Annotated[
        list[str] | None,
        typer.Option(
            "--storage-option",
            help="key=value for the object-store filesystem, repeatable: endpoint_override=host:9000, region=…, "
            "scheme=http (credentials come from the standard chain, never from here).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A local model directory, or a hub id (org/name) already in the Hugging Face cache; "
            "nothing is downloaded \\[default: the bundled demo reranker].",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Scoring profile: a built-in name (see `score-batch models`) or a JSON file. Default: the "
            "model's score_batch.json, else a built-in profile matching the model's name. Flags override it.",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    query_col: Annotated[
        str | None,
        typer.Option(help="Query column (default: query, or query_tokens).", rich_help_panel=COLUMNS),
    ] = None,
    item_col: Annotated[
        str | None,
        typer.Option(
            help="Item column of the long layout (default: item, or item_tokens).", rich_help_panel=COLUMNS
        ),
    ] = None,
    items_col: Annotated[
        str | None,
        typer.Option(
            help="List-of-items column of the nested layout (default: items, or items_tokens).",
            rich_help_panel=COLUMNS,
        ),
    ] = None,
    query_id_col: Annotated[
        str | None,
        typer.Option(help="Query id column (default: query_id if present).", rich_help_panel=COLUMNS),
    ] = None,
    item_id_col: Annotated[
        str | None,
        typer.Option(help="Item id column (long: item_id; nested: item_ids).", rich_help_panel=COLUMNS),
    ] = None,
    keep_columns: Annotated[
        str | None,
        typer.Option(help="Comma-separated input columns to copy to the output.", rich_help_panel=COLUMNS),
    ] = None,
    partition_by: Annotated[
        str | None,
        typer.Option(
            help="Write OUTPUT as a directory of Parquet files partitioned (hive style, col=value/) by these "
            "comma-separated output columns (ids or kept columns).",
            rich_help_panel=JOB,
            show_default=False,
        ),
    ] = None,
    label_tokens: Annotated[
        list[str] | None,
        typer.Option(
            help="CausalLM label tokens, each exactly one token; repeat the flag: --label-tokens ' no' --label-tokens ' yes'.",
            rich_help_panel=SCORING,
        ),
    ] = None,
    label_token_ids: Annotated[
        str | None, typer.Option(help="CausalLM label token ids, e.g. 2152,9693.", rich_help_panel=SCORING)
    ] = None,
    apply_softmax: Annotated[
        bool | None,
        typer.Option(
            "--apply-softmax/--no-apply-softmax",
            help="Softmax over the label logits (CausalLM) or the class logits (classifier).",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    score_index: Annotated[
        int | None,
        typer.Option(
            help="Which entry of scores becomes score \\[default: -1, the last].",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    pooled_hidden_states: Annotated[
        bool,
        typer.Option(
            "--pooled-hidden-states",
            help="Also write each item's final hidden state (LAST pooling, after the final norm).",
            rich_help_panel=SCORING,
        ),
    ] = False,
    normalize: Annotated[
        bool,
        typer.Option("--normalize", help="L2-normalize the pooled hidden states.", rich_help_panel=SCORING),
    ] = False,
    query_template: Annotated[
        str | None, typer.Option(help="Template around each query, with {query}.", rich_help_panel=SCORING)
    ] = None,
    item_template: Annotated[
        str | None, typer.Option(help="Template around each item, with {item}.", rich_help_panel=SCORING)
    ] = None,
    item_first: Annotated[
        bool | None,
        typer.Option(
            "--item-first",
            help="Reference sequence is item then query (runs unpacked).",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    packing: Annotated[
        str | None,
        typer.Option(
            help="mis: one packed sequence per query; single: one sequence per pair; auto: mis when the "
            "model allows it (decoders), else single (encoders, recurrent layers).",
            rich_help_panel=SCORING,
            show_default="auto",
        ),
    ] = None,
    delimiter_token_id: Annotated[
        int | None,
        typer.Option(
            help="Delimiter id between packed items (default 9999, or pad/eos when out of range).",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    max_query_tokens: Annotated[
        int | None,
        typer.Option(
            help="Longest query, in tokens (default: what the pack allows).",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    max_item_tokens: Annotated[
        int | None,
        typer.Option(
            help="Longest item, in tokens (default: what the pack allows).",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    truncate: Annotated[
        str | None,
        typer.Option(
            help="Over-long input: error (a row error), item-tail (cut the item's end), query-head (cut the query's start).",
            rich_help_panel=SCORING,
            show_default="error",
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.", rich_help_panel=ENGINE)] = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16.", rich_help_panel=ENGINE
        ),
    ] = "auto",
    backend: Annotated[
        str,
        typer.Option(
            help="Attention: auto, sdpa (reference), flex, flashinfer (CUDA).", rich_help_panel=ENGINE
        ),
    ] = "auto",
    max_batch_tokens: Annotated[
        int | None,
        typer.Option(
            help="Tokens per forward pass \\[default: 4096 on CPU, 65536 on CUDA].",
            rich_help_panel=ENGINE,
            show_default=False,
        ),
    ] = None,
    max_pack_tokens: Annotated[
        int, typer.Option(help="Longest packed sequence; larger groups are split.", rich_help_panel=ENGINE)
    ] = 8192,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code", help="Allow model code from the model directory.", rich_help_panel=ENGINE
        ),
    ] = False,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            "--allow-pickle",
            help="Allow pickle (.bin) weights, which can run code when loaded.",
            rich_help_panel=ENGINE,
        ),
    ] = False,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="torch.compile the decoder layers' norms, MLPs and attention projections + RoPE into fused "
            "kernels (the first batches compile, for seconds to minutes; every batch size reuses them).",
            rich_help_panel=ENGINE,
        ),
    ] = False,
    window_rows: Annotated[
        int, typer.Option(help="Input rows held in memory and checkpointed at a time.", rich_help_panel=JOB)
    ] = DEFAULT_WINDOW_ROWS,
    on_error: Annotated[
        str,
        typer.Option(
            help="A row that cannot be scored: fail (exit 2), record (error column), skip (errors file).",
            rich_help_panel=JOB,
        ),
    ] = "fail",
    errors_file: Annotated[
        str | None,
        typer.Option(
            help="Where --on-error skip lists skipped rows \\[default: OUTPUT.errors.jsonl; with -o -, stderr].",
            rich_help_panel=JOB,
            show_default=False,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue a killed run from its checkpointed parts.", rich_help_panel=JOB
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace an existing output (and stale parts).", rich_help_panel=JOB
        ),
    ] = False,
    report: Annotated[
        str | None, typer.Option(help="Write a JSON run report to this file.", rich_help_panel=JOB)
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Read and plan without loading the model; print the counts.",
            rich_help_panel=JOB,
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("-q", "--quiet", help="No progress and no summary.", rich_help_panel=JOB)
    ] = False,
    pipeline: Annotated[
        bool,
        typer.Option(
            "--pipeline/--no-pipeline",
            help="Read and plan the next window on a worker thread while the current one is scored.",
            rich_help_panel=JOB,
        ),
    ] = True,
    progress_seconds: Annotated[
        float,
        typer.Option(
            help="When stderr is not a terminal: a progress log line (rows, items/s, ETA) every N seconds.",
            rich_help_panel=JOB,
        ),
    ] = 30.0,
    log_format: Annotated[
        str,
        typer.Option(help="Log lines on stderr: text or json (one object per line).", rich_help_panel=JOB),
    ] = "text",
    threads: Annotated[
        int | None,
        typer.Option(
            help="Torch threads \\[default: the CPUs this process may use (affinity and cgroup quota)].",
            rich_help_panel=ENGINE,
            show_default=False,
        ),
    ] = None,
    input_format: Annotated[
        str,
        typer.Option(
            help="table (query/item rows), openai-batch (vLLM-style /v1/score and /v1/rerank batch file), or "
            "auto (openai-batch when the lines are batch requests).",
            rich_help_panel=COLUMNS,
        ),
    ] = "auto",
    top_k: Annotated[
        int | None,
        typer.Option(
            help="Keep the N best items of each query, best first, with a rank column.",
            rich_help_panel=SCORING,
            show_default=False,
        ),
    ] = None,
    rank: Annotated[
        bool,
        typer.Option(
            "--rank",
            help="Add a rank column (1 = best); each query's items come out best first.",
            rich_help_panel=SCORING,
        ),
    ] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Run on Ray Data: -o names a directory of Parquet files (with a row_index column).",
            rich_help_panel=RAY,
        ),
    ] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Ray cluster to join: auto (the running cluster) or ray://host:port \\[default: a local Ray].",
            rich_help_panel=RAY,
            show_default=False,
        ),
    ] = None,
    num_workers: Annotated[
        int, typer.Option(help="Scoring actors, each holding one loaded model.", rich_help_panel=RAY)
    ] = 1,
    gpus_per_worker: Annotated[
        float | None,
        typer.Option(
            help="GPUs per actor \\[default: 1 when the cluster has GPUs, else 0].",
            rich_help_panel=RAY,
            show_default=False,
        ),
    ] = None,
    cpus_per_worker: Annotated[
        float, typer.Option(help="CPUs per actor (also its torch threads).", rich_help_panel=RAY)
    ] = 1.0,
) -> None:
    flags = dict(locals())
    setup_logging(quiet, log_format)
    report = job.run(run_config(flags))
    if not quiet:
        typer.echo(report.summary(), err=True)


def run_config(flags: dict) -> RunConfig:
    """Resolve the flags of one invocation into a RunConfig (model, profile, engine, columns, job)."""
    model_dir = resolve_model_dir(flags["model"]) if flags["model"] else DEMO_MODEL_DIR
    profile = choose_profile(flags["profile"], flags["model"] or "", model_dir)
    if profile is not None:
        logging.getLogger(__name__).info("scoring profile: %s (%s)", profile.name, profile.source)
    scoring = scoring_config(
        profile,
        {
            "label_tokens": tuple(flags["label_tokens"]) if flags["label_tokens"] else None,
            "label_token_ids": comma_ints(flags["label_token_ids"], "--label-token-ids"),
            "apply_softmax": flags["apply_softmax"],
            "score_index": flags["score_index"],
            "query_template": flags["query_template"],
            "item_template": flags["item_template"],
            "item_first": flags["item_first"],
            "delimiter_token_id": flags["delimiter_token_id"],
            "pooled_hidden_states": flags["pooled_hidden_states"] or None,
            "normalize": flags["normalize"] or None,
            "packing": flags["packing"],
            "max_query_tokens": flags["max_query_tokens"],
            "max_item_tokens": flags["max_item_tokens"],
            "truncate": flags["truncate"],
        },
    )
    engine = EngineConfig(
        device=flags["device"],
        dtype=flags["dtype"],
        backend=flags["backend"],
        max_batch_tokens=flags["max_batch_tokens"],
        max_pack_tokens=flags["max_pack_tokens"],
        trust_remote_code=flags["trust_remote_code"],
        allow_pickle=flags["allow_pickle"],
        compile=flags["compile"],
        scoring=scoring,
    )
    ray = (
        RayOptions(
            flags["ray_address"], flags["num_workers"], flags["gpus_per_worker"], flags["cpus_per_worker"]
        )
        if flags["ray"]
        else None
    )
    inputs = split_inputs(flags["input"])
    return RunConfig(
        input=inputs[0] if len(inputs) == 1 else inputs,
        storage_options=parse_storage_options(flags["storage_option"]),
        partition_by=comma_list(flags["partition_by"]),
        output=flags["output"],
        model_dir=model_dir,
        columns=ColumnOverrides(
            query_col=flags["query_col"],
            item_col=flags["item_col"],
            items_col=flags["items_col"],
            query_id_col=flags["query_id_col"],
            item_id_col=flags["item_id_col"],
            keep_columns=comma_list(flags["keep_columns"]),
        ),
        engine=engine,
        window_rows=flags["window_rows"],
        on_error=flags["on_error"],
        errors_file=flags["errors_file"],
        resume=flags["resume"],
        overwrite=flags["overwrite"],
        report=flags["report"],
        dry_run=flags["dry_run"],
        quiet=flags["quiet"],
        ray=ray,
        input_format=flags["input_format"],
        top_k=flags["top_k"],
        rank=flags["rank"],
        threads=flags["threads"],
        progress_seconds=flags["progress_seconds"],
        pipeline=flags["pipeline"],
    )
