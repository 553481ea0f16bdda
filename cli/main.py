"""The score-batch command: flags → RunConfig → run_job, with exit codes 0 / 1 / 2 / 130 / 143."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.config import DEFAULT_WINDOW_ROWS, DEMO_MODEL_DIR, ON_ERROR_MODES, RunConfig
from cli.profile import choose_profile, merge_profile
from cli.runner import Stopped, run_job
from engine.config import (
    BACKENDS,
    DEVICES,
    DTYPES,
    PACKING_MODES,
    TRUNCATE_POLICIES,
    EngineConfig,
    ScoringConfig,
)
from engine.errors import ScoringInputError
from engine.model_source import resolve_model_dir
from io_formats.errors import InputError
from io_formats.schema import ColumnOverrides

EXIT_USAGE = 2
EXIT_FAILURE = 1

app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)

COLUMNS = "Input columns"
SCORING = "Scoring"
ENGINE = "Engine"
JOB = "Batch job"
RAY = "Scale-out on Ray (pip install -e '.\\[ray]')"


def _csv_ints(value: str | None, flag: str) -> tuple[int, ...] | None:
    """Parse '1,2,3' into integers, with a usage error naming the flag."""
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is not a comma-separated list of integers", param_hint=flag
        ) from None


def _choice(value: str, choices: tuple[str, ...], flag: str) -> str:
    """Check a value against its choices with a usage error naming the flag."""
    if value not in choices:
        _usage_error(f"{flag}: {value!r} is not one of {', '.join(choices)}")
    return value


@app.command(
    help=(
        "Score every (query, item) pair of INPUT with a local Hugging Face model and write one score per pair.\n\n"
        "Each query is packed with all of its items into one sequence (multi-item scoring), so the query is "
        "computed once; every score equals a separate query+item forward pass.\n\n"
        "[bold]Examples[/bold]\n\n"
        "  score-batch sample_data/products.parquet -o scores.parquet            [dim]# demo model[/dim]\n\n"
        "  cat pairs.jsonl | score-batch - -o - --model ./my-reranker --label-tokens ' no' --label-tokens ' yes'\n\n"
        "  score-batch big/ -o out.parquet --model ./rm --resume --on-error record --report run.json\n\n"
        "  score-batch data.parquet -o out.parquet --model Qwen/Qwen3-Reranker-0.6B   [dim]# from the HF cache, built-in profile[/dim]\n\n"
        "  score-batch models            [dim]# supported models, packing, built-in profiles[/dim]"
    ),
)
def main(
    input: Annotated[
        str,
        typer.Argument(
            help="A .parquet or .jsonl file, a directory of .parquet files, or - (JSONL on stdin)."
        ),
    ],
    output: Annotated[
        str, typer.Option("-o", "--output", help="A .parquet or .jsonl path, or - for JSONL on stdout.")
    ] = "scores.parquet",
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A local model directory, or a hub id (org/name) already in the Hugging Face cache; "
            "nothing is downloaded \\[default: the demo model in sample_data/].",
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
        str,
        typer.Option(
            help="mis: one packed sequence per query; single: one sequence per pair; auto: mis when the "
            "model allows it (decoders), else single (encoders, recurrent layers).",
            rich_help_panel=SCORING,
        ),
    ] = "auto",
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
        str,
        typer.Option(
            help="Over-long input: error (a row error), item-tail (cut the item's end), query-head (cut the query's start).",
            rich_help_panel=SCORING,
        ),
    ] = "error",
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
        bool, typer.Option("-q", "--quiet", help="No progress bar and no summary.", rich_help_panel=JOB)
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
    _setup_logging(quiet)
    scoring_flags = {
        "label_tokens": tuple(label_tokens) if label_tokens else None,
        "label_token_ids": _csv_ints(label_token_ids, "--label-token-ids"),
        "apply_softmax": apply_softmax,
        "score_index": score_index,
        "query_template": query_template,
        "item_template": item_template,
        "item_first": item_first,
        "delimiter_token_id": delimiter_token_id,
    }
    try:
        model_dir = resolve_model_dir(model) if model else DEMO_MODEL_DIR
        chosen = choose_profile(profile, model or "", model_dir)
        if chosen is not None:
            logging.getLogger("score_batch").info("scoring profile: %s (%s)", chosen.name, chosen.source)
        scoring_values = merge_profile(chosen.settings if chosen else {}, scoring_flags)
        scoring = ScoringConfig(
            **scoring_values,
            pooled_hidden_states=pooled_hidden_states,
            normalize=normalize,
            packing=_choice(packing, PACKING_MODES, "--packing"),
            max_query_tokens=max_query_tokens,
            max_item_tokens=max_item_tokens,
            truncate=_choice(truncate, TRUNCATE_POLICIES, "--truncate"),
        )
        engine = EngineConfig(
            device=_choice(device, DEVICES, "--device"),
            dtype=_choice(dtype, DTYPES, "--dtype"),
            backend=_choice(backend, BACKENDS, "--backend"),
            max_batch_tokens=max_batch_tokens,
            max_pack_tokens=max_pack_tokens,
            trust_remote_code=trust_remote_code,
            allow_pickle=allow_pickle,
            scoring=scoring,
        )
    except (ValueError, InputError, ScoringInputError) as error:
        _usage_error(str(error))
    if window_rows < 1:
        _usage_error(f"--window-rows must be at least 1, got {window_rows}")
    if resume and output == "-":
        _usage_error("--resume needs an output file (stdout cannot be resumed)")
    config = RunConfig(
        input=input,
        output=output,
        model_dir=model_dir,
        columns=ColumnOverrides(
            query_col=query_col,
            item_col=item_col,
            items_col=items_col,
            query_id_col=query_id_col,
            item_id_col=item_id_col,
            keep_columns=tuple(c.strip() for c in keep_columns.split(",") if c.strip())
            if keep_columns
            else (),
        ),
        engine=engine,
        window_rows=window_rows,
        on_error=_choice(on_error, ON_ERROR_MODES, "--on-error"),
        errors_file=errors_file,
        resume=resume,
        overwrite=overwrite,
        report=report,
        dry_run=dry_run,
        quiet=quiet,
    )
    if num_workers < 1 or cpus_per_worker <= 0 or (gpus_per_worker is not None and gpus_per_worker < 0):
        _usage_error("--num-workers must be at least 1 and --cpus-per-worker/--gpus-per-worker positive")
    try:
        if ray:
            from cli.ray_job import RayOptions, run_ray_job

            options = RayOptions(ray_address, num_workers, gpus_per_worker, cpus_per_worker)
            result = run_ray_job(config, options)
        else:
            result = run_job(config)
    except (InputError, ScoringInputError) as error:
        _usage_error(str(error))
    except Stopped as stopped:
        logging.getLogger("score_batch").error(
            "stopped by %s; completed windows are checkpointed: rerun with --resume to continue", stopped
        )
        raise typer.Exit(128 + stopped.signum) from None
    if report:
        result.write(report)
    if not quiet:
        print(result.summary(), file=sys.stderr)


def _usage_error(message: str) -> None:
    """Print a one-paragraph error on stderr and exit 2 (no traceback)."""
    print(f"score-batch: error: {message}", file=sys.stderr)
    raise typer.Exit(EXIT_USAGE)


def _setup_logging(quiet: bool) -> None:
    """Log to stderr (rich when a terminal); silence library progress bars and chatter."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    handler: logging.Handler
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False, show_time=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("score-batch: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.ERROR if quiet else logging.INFO, handlers=[handler], force=True)


def run() -> None:
    """Console entry point: unexpected failures exit 1 with the traceback on stderr."""
    command = app
    if sys.argv[1:2] == ["models"] and not Path("models").exists():  # `score-batch models`, not a file
        from cli.models import app as command

        sys.argv.pop(1)
    try:
        code = command(standalone_mode=False)  # returns the exit code of typer.Exit when not standalone
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        sys.exit(130)
    except Exception as error:
        if hasattr(error, "show") and hasattr(error, "exit_code"):  # click's usage errors (exit 2)
            error.show(file=sys.stderr)
            sys.exit(error.exit_code)
        logging.getLogger("score_batch").exception("unexpected failure (a bug: please report it)")
        sys.exit(EXIT_FAILURE)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    run()
