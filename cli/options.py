"""Every option of `score` and `run-batch`, declared once: OPTIONS, an Option each (the config field it sets,
its type and default on the command line, its flags, --help panel and text), from which the Typer commands, the
flag names in messages (cli/flags.py) and docs/flags.md's table (scripts/flag_table.py) are derived.

Import-light on purpose (typer and the standard library only): Typer builds --help from these declarations, so
nothing here may import torch, transformers, pyarrow or the engine. Choices are the Literal types of
score_batch/choices.py; tests/test_cli_options.py checks every option's choices and default against its field.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from score_batch import choices
from score_batch.errors import ConfigError

# The --help panels, in this order.
INPUT = "Input & columns"
SCORING = "Model & scoring"
OUTPUT = "Output"
JOB = "Job control"
ENGINE = "Engine"
RAY = "Scale-out on Ray (pip install -e '.\\[ray]')"
PANELS = (INPUT, SCORING, OUTPUT, JOB, ENGINE, RAY)
# The config classes options set (Owner of Owner.field).
RUN, ENG, SCO, COLS, RAYS = "RunConfig", "EngineConfig", "ScoringConfig", "ColumnOverrides", "RayOptions"
ENV_PREFIX = "SCORE_BATCH"  # every option is also SCORE_BATCH_<OPTION> (cli/app.py's auto_envvar_prefix)
REQUIRED = inspect.Parameter.empty  # an option without a default


@dataclass(frozen=True)
class Option:
    """One option: the config field it sets (`sets`: Owner when the field has the option's name, Owner.field
    when not, None for the command's own), its type and default on the command line, and how --help shows it."""

    name: str  # the command's parameter; its environment variable is SCORE_BATCH_<NAME>
    sets: str | None
    type: Any
    default: Any
    panel: str
    help: str
    flags: tuple[str, ...] = ()  # as declared ("-o", "--output"; "--pipeline/--no-pipeline"); none: --name
    metavar: str | None = None
    shown: str | bool = True  # a default in words, shown as [default: …] (a None default is otherwise not)
    convert: Callable[[Any], Any] | None = None  # the command-line value → the config field's value
    argument: bool = False

    @property
    def setting(self) -> str | None:
        """The config field it sets, as Owner.field (ScoringConfig.truncate)."""
        return self.sets if self.sets is None or "." in self.sets else f"{self.sets}.{self.name}"

    @property
    def flag(self) -> str:
        """Its long flag (INPUT for the argument)."""
        if self.argument:
            return self.name.upper()
        return next(n for n in self._names() if n.startswith("--") and not n.startswith("--no-"))

    @property
    def off(self) -> str | None:
        """Its --no- form, if declared."""
        return next((n for n in self._names() if n.startswith("--no-")), None)

    @property
    def repeatable(self) -> bool:
        """True for a flag given once per value (a list): --label-tokens ' no' --label-tokens ' yes'."""
        return any(typing.get_origin(t) is list for t in (self.type, *typing.get_args(self.type)))

    @property
    def env(self) -> str:
        """Its environment variable (click's auto_envvar_prefix rule; an argument reads none)."""
        return f"{ENV_PREFIX}_{self.name.upper()}"

    def _names(self) -> list[str]:
        """Its flag names, the --no- form included."""
        names = [name for decl in self.flags for name in decl.split("/")]
        return names or ["--" + self.name.replace("_", "-")]

    def parameter(self) -> inspect.Parameter:
        """The Typer command's parameter: the type annotated with its typer.Option (or typer.Argument)."""
        said = dict(help=self.help, rich_help_panel=self.panel, metavar=self.metavar, show_default=self.shown)
        info = typer.Argument(**said) if self.argument else typer.Option(*self.flags, **said)
        kind = inspect.Parameter.KEYWORD_ONLY
        return inspect.Parameter(self.name, kind, annotation=Annotated[self.type, info], default=self.default)


def _inputs(arguments: list[str] | str) -> str | tuple[str, ...]:
    """INPUT arguments (each may list several, comma-separated) → RunConfig.input."""
    from score_batch.io_formats.locations import split_inputs

    inputs = split_inputs(arguments)
    return inputs[0] if len(inputs) == 1 else inputs


def _storage_options(pairs: list[str] | None) -> tuple[tuple[str, str], ...]:
    """--storage-option key=value … → RunConfig.storage_options."""
    from score_batch.io_formats.remote import parse_storage_options

    return parse_storage_options(pairs)


def _comma_list(value: str | None) -> tuple[str, ...]:
    """'a, b,c' → ('a', 'b', 'c'); None → ()."""
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


def _label_token_ids(value: str | None) -> tuple[int, ...] | None:
    """'1,2,3' → (1, 2, 3); a ConfigError naming the setting (so its flag) for anything else."""
    try:
        return None if value is None else tuple(int(v) for v in _comma_list(value))
    except ValueError:
        problem = "is not a comma-separated list of integers"
        raise ConfigError(f"{SCO}.label_token_ids", value, problem) from None


def _tuple(values: list | None) -> tuple:
    """A repeated option's values as a tuple (none: ())."""
    return tuple(values) if values else ()


OPTIONS = (
    Option("input", RUN, list[str], REQUIRED, INPUT, "One or more inputs, read in order: .parquet, .jsonl, "
           ".jsonl.gz or .jsonl.zst files, directories (with key=value partition directories) or globs; "
           "local paths or file://, s3://, gs://, https://, hf:// URIs; or - (JSONL on stdin). One argument "
           "may list several, separated by commas.", metavar="INPUT...", shown=False, convert=_inputs,
           argument=True),
    Option("output", RUN, str, "scores.parquet", OUTPUT, "A .parquet or .jsonl path (local, file://, s3://, "
           "gs://), or - for JSONL on stdout.", ("-o", "--output"), "PATH"),
    Option("storage_option", f"{RUN}.storage_options", list[str] | None, None, INPUT, "For the object-store "
           "filesystem (inputs and outputs), repeatable: endpoint_override=host:9000, region=…, scheme=http "
           "(credentials come from the standard chain, never from here).", ("--storage-option",), "KEY=VALUE",
           convert=_storage_options),
    Option("model", f"{RUN}.model_dir", str | None, None, SCORING, "A local model directory, or a hub id "
           "(org/name) already in the Hugging Face cache; nothing is downloaded.", ("--model",), "DIR|HUB_ID",
           "the bundled demo reranker"),
    Option("profile", None, str | None, None, SCORING, "Scoring profile: a built-in name (see `score-batch "
           "models`) or a JSON file; flags override it.", (), "NAME|FILE",
           "the model's score_batch.json, else the built-in one its name matches"),
    Option("query_col", COLS, str | None, None, INPUT, "Query column.", (), "COLUMN",
           "query, or query_tokens"),
    Option("item_col", COLS, str | None, None, INPUT, "Item column (one item per row).", (), "COLUMN",
           "item, or item_tokens"),
    Option("items_col", COLS, str | None, None, INPUT, "List-of-items column (a list per row).", (), "COLUMN",
           "items, or items_tokens"),
    Option("query_id_col", COLS, str | None, None, INPUT, "Query id column, or several comma-separated "
           "(dt,user_id,query): rows equal in each are one query, for --rank and --top-k; query_id is then "
           "a struct of them. Without one, query_id is a digest of the query text (docs/ranking.md).", (),
           "COLUMNS", "query_id if present"),
    Option("item_id_col", COLS, str | None, None, INPUT, "Item id column.", (), "COLUMN",
           "item_id, or item_ids if present"),
    Option("keep_columns", COLS, str | None, None, OUTPUT, "Comma-separated input columns to copy to the "
           "output.", (), "COLUMNS", convert=_comma_list),
    Option("input_format", RUN, choices.RequestedFormat, "auto", INPUT, "table (query/item rows), "
           "openai-batch (vLLM-style /v1/score and /v1/rerank batch file, as `score-batch run-batch`), or "
           "auto (openai-batch when the lines are batch requests)."),
    Option("hive_types", RUN, choices.HiveTypes, "infer", INPUT, "Values of key=value partition "
           "directories: infer (integers, dates, … as DuckDB and polars type them) or string (keep the "
           "text)."),
    Option("partition_by", RUN, str | None, None, OUTPUT, "Write OUTPUT as a directory of Parquet files "
           "partitioned (hive style, col=value/) by these comma-separated output columns (ids or kept "
           "columns).", (), "COLUMNS", convert=_comma_list),
    Option("label_tokens", SCO, list[str] | None, None, SCORING, "CausalLM label tokens, each exactly one "
           "token; repeat the flag: --label-tokens ' no' --label-tokens ' yes'.", (), "TOKEN",
           convert=lambda tokens: tuple(tokens) if tokens else None),
    Option("label_token_ids", SCO, str | None, None, SCORING, "CausalLM label token ids, e.g. 2152,9693.", (),
           "IDS", convert=_label_token_ids),
    Option("apply_softmax", SCO, bool | None, None, SCORING, "Softmax over the label logits (CausalLM) or "
           "the class logits (classifier) in scores.", ("--apply-softmax/--no-apply-softmax",)),
    Option("activation", SCO, choices.ActivationChoice | None, None, SCORING, "How score is made from a "
           "classifier's logits (scores stays raw): auto (as sentence-transformers' CrossEncoder: the "
           "model's activation_fn, else sigmoid for one label, else the softmax probability of the "
           "--score-index class), none (the raw value), sigmoid or softmax.", shown="auto"),
    Option("label_score", SCO, choices.LabelScore | None, None, SCORING, "CausalLM label scores: "
           "probability (P(label) over the vocabulary, or over the labels with --apply-softmax), logit (the "
           "label token's raw logit, as FlagEmbedding's LLM rerankers return it) or sigmoid (of that logit: "
           "FlagEmbedding's normalize=True).", shown="probability"),
    Option("score_index", SCO, int | None, None, SCORING, "Which entry of scores becomes score.",
           shown="-1, the last"),
    Option("pooled_hidden_states", SCO, bool | None, None, OUTPUT, "Also write each item's final hidden "
           "state (LAST pooling, after the final norm), in the column pooled_hidden_state.",
           ("--pooled-hidden-states",)),
    Option("normalize", SCO, bool | None, None, OUTPUT, "L2-normalize the pooled hidden states.",
           ("--normalize",)),
    Option("query_template", SCO, str | None, None, SCORING, "Template around each query, with {query}."),
    Option("item_template", SCO, str | None, None, SCORING, "Template around each item, with {item}."),
    Option("item_first", SCO, bool | None, None, SCORING, "Reference sequence is item then query (runs "
           "unpacked).", ("--item-first",)),
    Option("packing", SCO, choices.Packing | None, None, SCORING, "mis: one packed sequence per query; "
           "single: one sequence per pair; auto: mis when the model allows it (decoders), else single "
           "(encoders, recurrent layers).", shown="auto"),
    Option("delimiter_token_id", SCO, int | None, None, SCORING, "Delimiter id between packed items.",
           shown="9999, or pad/eos when out of range"),
    Option("max_query_tokens", SCO, int | None, None, SCORING, "Longest query, in tokens.",
           shown="what the pack allows"),
    Option("max_item_tokens", SCO, int | None, None, SCORING, "Longest item, in tokens.",
           shown="what the pack allows"),
    Option("truncate", SCO, choices.Truncate | None, None, SCORING, "Over-long input: error (a row error), "
           "item-tail (cut the item's end), query-head (cut the query's start), longest-first "
           "(CrossEncoder's rule: cut the longer of query and item), chunk (score an over-long item as "
           "chunks of --max-item-tokens, one output row per item: see --chunk-aggregate).", shown="error"),
    Option("chunk_overlap", SCO, int | None, None, SCORING, "With --truncate chunk: tokens each chunk "
           "shares with the one before it.", shown="0"),
    Option("chunk_aggregate", SCO, choices.ChunkAggregate | None, None, SCORING, "With --truncate chunk: "
           "the item's score is its best chunk's (max; that chunk also gives scores and the pooled vector), "
           "its first chunk's, or the mean of every column.", shown="max"),
    Option("top_k", RUN, int | None, None, OUTPUT, "Keep the N best items of each query, best first, with a "
           "rank column.", (), "N"),
    Option("rank", RUN, bool, False, OUTPUT, "Add a rank column (1 = best); each query's items come out "
           "best first.", ("--rank",)),
    Option("ranked_output", None, str | None, None, OUTPUT, "Removed (refused): pass --rank and filter "
           "rank <= k for the ranked view (docs/ranking.md).", (), "PATH"),
    Option("device", ENG, choices.Device, "auto", ENGINE, "Where to run."),
    Option("dtype", ENG, choices.Dtype, "auto", ENGINE, "auto: bf16 on CUDA, fp32 on CPU. fp8: the decoder "
           "layers' GEMMs in FP8 over bf16 (Hopper or later); fp8-emulated: the same quantization emulated "
           "anywhere, for benchmarks."),
    Option("backend", ENG, choices.Backend, "auto", ENGINE, "Attention: sdpa is the reference; flashinfer "
           "(the multi-item mask) and flashinfer-two-phase (two ragged prefills merged by LSE) need CUDA; "
           "auto takes flashinfer there."),
    Option("max_batch_tokens", ENG, int | None, None, ENGINE, "Tokens per forward pass.",
           shown="4096 on CPU, 65536 on CUDA"),
    Option("max_pack_tokens", ENG, int, 8192, ENGINE, "Longest packed sequence; larger groups are split."),
    Option("trust_remote_code", ENG, bool, False, ENGINE, "Allow model code from the model directory.",
           ("--trust-remote-code",)),
    Option("allow_pickle", ENG, bool, False, ENGINE, "Allow pickle (.bin) weights, which can run code when "
           "loaded.", ("--allow-pickle",)),
    Option("compile", ENG, bool, False, ENGINE, "torch.compile the decoder layers' norms, MLPs and "
           "attention projections + RoPE into fused kernels (the first batches compile, for seconds to "
           "minutes; every batch size reuses them).", ("--compile",)),
    Option("layers", ENG, choices.Layers, "auto", ENGINE, "Decoder layers: native (our own fused "
           "Llama/Mistral/Qwen2/Qwen3 layers) or transformers' modeling code; auto: native when the "
           "model's config is fully implemented there (else one log line says why not)."),
    Option("ops", ENG, choices.Ops, "auto", ENGINE, "Element-wise kernels of native layers (RMSNorm + "
           "residual, RoPE, SiLU·mul); auto: flashinfer on CUDA when installed, torch elsewhere."),
    Option("verify", ENG, int | None, None, ENGINE, "Score N items chosen at random across the run again, "
           "each alone through the reference path (sdpa, torch ops, the run's dtype); the report's verify says "
           "the largest difference and the bound, and a warning names the items beyond it.", (), "N",
           shown="16 on a GPU kernel path, 0 on the CPU reference path"),
    Option("threads", RUN, int | None, None, ENGINE, "Torch threads.",
           shown="the CPUs this process may use (affinity, cgroup quota)"),
    Option("window_rows", RUN, int, 2048, JOB, "Input rows held in memory and checkpointed "
           "at a time."),
    Option("on_error", RUN, choices.OnError, "fail", JOB, "A row that cannot be scored: fail (exit 2), "
           "record (error column), skip (errors file)."),
    Option("errors_file", RUN, str | None, None, JOB, "Where --on-error skip lists skipped rows "
           "(- for stderr, a log line each).", (), "FILE", "OUTPUT.errors.jsonl; with -o -, stderr"),
    Option("max_failed_rate", RUN, float | None, None, JOB, "Fail the run (exit 4, after its output is "
           "written) when more than this fraction of its items failed (0: any; 1: never).", (), "RATE",
           "fail only when every item failed"),
    Option("resume", RUN, bool, False, JOB, "Continue a killed run from its checkpointed parts.",
           ("--resume",)),
    Option("overwrite", RUN, bool, False, JOB, "Replace an existing output (and stale parts).",
           ("--overwrite",)),
    Option("report", RUN, str | None, None, JOB, "Write a JSON run report to this file (- for stderr), "
           "however the run ends.", (), "FILE"),
    Option("dry_run", RUN, bool, False, JOB, "Read and plan without loading the model; print the counts.",
           ("--dry-run",)),
    Option("quiet", RUN, bool, False, JOB, "No progress and no summary; warnings (skipped or failed rows) "
           "and errors still show.", ("-q", "--quiet")),
    Option("pipeline", RUN, bool, True, ENGINE, "Read, tokenize and pack the next windows on worker threads "
           "while the current one is scored.", ("--pipeline/--no-pipeline",)),
    Option("progress_seconds", RUN, float, 30.0, JOB, "When stderr is not a terminal: a progress log line "
           "(rows, items/s, ETA) every N seconds.", (), "N"),
    Option("price_per_hour", RUN, float | None, None, JOB, "The machine's price per hour (any currency): "
           "the report's usage then gives the run's cost and the cost per million items.", (), "PRICE"),
    Option("reuse", RUN, list[str] | None, None, JOB, "Earlier score-batch outputs, as INPUT takes them "
           "(files, partitioned directories, globs, s3://…; repeatable or comma-separated): pairs whose "
           "score key matches (same query, item, model content and scoring settings) copy their score, "
           "scores and pooled vectors bit for bit; only the rest is scored (docs/operations.md).",
           ("--reuse",), "PATH|URI", convert=_tuple),
    Option("reuse_missing_ok", RUN, bool, False, JOB, "A --reuse output that is not there (the earlier run "
           "failed) is a warning, and its pairs are scored, instead of exit 2.", ("--reuse-missing-ok",)),
    Option("log_format", None, choices.LogFormat, "text", JOB, "Log lines on stderr: text or json (one "
           "object per line)."),
    Option("ray", RUN, bool, False, RAY, "Run on Ray Data: -o names a directory of Parquet files (with a "
           "row_index column).", ("--ray",)),
    Option("ray_address", f"{RAYS}.address", str | None, None, RAY, "Ray cluster to join: auto (the running "
           "cluster) or ray://host:port.", (), "ADDRESS", "a local Ray"),
    Option("num_workers", RAYS, int, 1, RAY, "Scoring actors, each holding one loaded model."),
    Option("gpus_per_worker", RAYS, float | None, None, RAY, "GPUs per actor.",
           shown="1 when the cluster has GPUs, else 0"),
    Option("cpus_per_worker", RAYS, float, 1.0, RAY, "CPUs per actor (also its torch threads)."),
)  # fmt: skip
OPTION = {option.name: option for option in OPTIONS}
BY_SETTING = {option.setting: option for option in OPTIONS if option.sets}  # config field → its option
RANKED_OUTPUT_REMOVED = (  # what --ranked-output says: the ranked view is one filter of a --rank output
    "--ranked-output is removed: pass --rank, which gives every row its rank, and filter rank <= k for the "
    "ranked view (docs/ranking.md: one line of DuckDB or polars)"
)
# Config fields no option sets: the nested configs (built from their fields' options) and the Python API's own.
FLAGLESS = (f"{RUN}.columns", f"{RUN}.engine", f"{ENG}.scoring", f"{RAYS}.groups_per_batch")

# run-batch: score's options with vLLM's spelling of the batch file and the output (both required), and no
# --input-format (it means openai-batch).
RUN_BATCH_FIXED = {"input_format": "openai-batch"}
RUN_BATCH = {
    "input": dataclasses.replace(OPTION["input"], type=str, help="The batch file: JSONL of /v1/score and "
                                 "/v1/rerank requests (vLLM's run-batch format), or - for stdin.",
                                 flags=("-i", "--input-file"), metavar="FILE", shown=True, argument=False),
    "output": dataclasses.replace(OPTION["output"], default=REQUIRED, help="The output JSONL file, or - for "
                                  "stdout.", flags=("-o", "--output", "--output-file"), metavar="FILE"),
}  # fmt: skip
RUN_BATCH_OPTIONS = tuple(RUN_BATCH.get(o.name, o) for o in OPTIONS if o.name not in RUN_BATCH_FIXED)

ScoreOptions = dataclasses.make_dataclass(
    "ScoreOptions",
    [(option.name, option.type) for option in OPTIONS],
    namespace={"__doc__": "One invocation's options, typed (OPTIONS' names, in that order)."},
    frozen=True,
)


def command_from(
    options: tuple[Option, ...], run: Callable[[Any], None], fixed: dict | None = None
) -> Callable[..., None]:
    """A function Typer can register: its parameters are options' (fixed gives the values of those it lacks);
    calling it runs run(ScoreOptions(…))."""
    parameters = [option.parameter() for option in options]

    def command(**values: Any) -> None:
        run(ScoreOptions(**values, **(fixed or {})))

    command.__signature__ = inspect.Signature(parameters)  # what Typer reads to build the command's flags
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command
