"""The score command's options, declared once: typed Annotated aliases and ScoreOptions, whose fields they type.

Import-light on purpose (typer and the standard library only): Typer builds --help from these
declarations, so nothing here may import torch, transformers, pyarrow or the engine. Choices are the
Literal types of score_batch/choices.py; tests/test_cli_options.py checks every default against the configs.
Each field of ScoreOptions sets the config field of the same name (cli/flags.py lists the exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import typer

from score_batch import choices

# The --help panels, in this order (the first option of each, in ScoreOptions' field order, places it).
INPUT = "Input & columns"
SCORING = "Model & scoring"
OUTPUT = "Output"
JOB = "Job control"
ENGINE = "Engine"
RAY = "Scale-out on Ray (pip install -e '.\\[ray]')"
PANELS = (INPUT, SCORING, OUTPUT, JOB, ENGINE, RAY)

DEFAULT_WINDOW_ROWS = 2048  # RunConfig's default; a test keeps them equal

InputArg = Annotated[
    list[str],
    typer.Argument(
        help="One or more inputs, read in order: .parquet, .jsonl, .jsonl.gz or .jsonl.zst files, directories "
        "(with key=value partition directories) or globs; local paths or file://, s3://, gs://, https://, "
        "hf:// URIs; or - (JSONL on stdin). One argument may list several, separated by commas.",
        show_default=False,
        metavar="INPUT...",
        rich_help_panel=INPUT,
    ),
]


def _option(panel: str, help: str, *names: str, **settings) -> typer.models.OptionInfo:
    """A typer.Option in a --help panel; a default of None never shows in --help: one given in words does,
    as show_default="…" (shown as [default: …], the style of every default)."""
    return typer.Option(*names, help=help, rich_help_panel=panel, **settings)


InputFileOpt = Annotated[
    str,
    _option(
        INPUT,
        "The batch file: JSONL of /v1/score and /v1/rerank requests (vLLM's run-batch format), or - for stdin.",
        "-i",
        "--input-file",
        metavar="FILE",
    ),
]
OutputOpt = Annotated[
    str,
    _option(
        OUTPUT,
        "A .parquet or .jsonl path (local, file://, s3://, gs://), or - for JSONL on stdout.",
        "-o",
        "--output",
        metavar="PATH",
    ),
]
OutputFileOpt = Annotated[
    str,
    _option(
        OUTPUT, "The output JSONL file, or - for stdout.", "-o", "--output", "--output-file", metavar="FILE"
    ),
]
StorageOpt = Annotated[
    list[str] | None,
    _option(
        INPUT,
        "For the object-store filesystem (inputs and outputs), repeatable: endpoint_override=host:9000, "
        "region=…, scheme=http (credentials come from the standard chain, never from here).",
        "--storage-option",
        metavar="KEY=VALUE",
    ),
]
ModelOpt = Annotated[
    str | None,
    _option(
        SCORING,
        "A local model directory, or a hub id (org/name) already in the Hugging Face cache; "
        "nothing is downloaded.",
        "--model",
        metavar="DIR|HUB_ID",
        show_default="the bundled demo reranker",
    ),
]
ProfileOpt = Annotated[
    str | None,
    _option(
        SCORING,
        "Scoring profile: a built-in name (see `score-batch models`) or a JSON file; flags override it.",
        metavar="NAME|FILE",
        show_default="the model's score_batch.json, else the built-in one its name matches",
    ),
]
QueryColOpt = Annotated[
    str | None, _option(INPUT, "Query column.", metavar="COLUMN", show_default="query, or query_tokens")
]
ItemColOpt = Annotated[
    str | None,
    _option(INPUT, "Item column (one item per row).", metavar="COLUMN", show_default="item, or item_tokens"),
]
ItemsColOpt = Annotated[
    str | None,
    _option(
        INPUT,
        "List-of-items column (a list per row).",
        metavar="COLUMN",
        show_default="items, or items_tokens",
    ),
]
QueryIdColOpt = Annotated[
    str | None, _option(INPUT, "Query id column.", metavar="COLUMN", show_default="query_id if present")
]
ItemIdColOpt = Annotated[
    str | None,
    _option(INPUT, "Item id column.", metavar="COLUMN", show_default="item_id, or item_ids if present"),
]
KeepColumnsOpt = Annotated[
    str | None, _option(OUTPUT, "Comma-separated input columns to copy to the output.", metavar="COLUMNS")
]
InputFormatOpt = Annotated[
    choices.RequestedFormat,
    _option(
        INPUT,
        "table (query/item rows), openai-batch (vLLM-style /v1/score and /v1/rerank batch file, as "
        "`score-batch run-batch`), or auto (openai-batch when the lines are batch requests).",
    ),
]
HiveTypesOpt = Annotated[
    choices.HiveTypes,
    _option(
        INPUT,
        "Values of key=value partition directories: infer (integers, dates, … as DuckDB and polars type "
        "them) or string (keep the text).",
    ),
]
PartitionByOpt = Annotated[
    str | None,
    _option(
        OUTPUT,
        "Write OUTPUT as a directory of Parquet files partitioned (hive style, col=value/) by these "
        "comma-separated output columns (ids or kept columns).",
        metavar="COLUMNS",
    ),
]
LabelTokensOpt = Annotated[
    list[str] | None,
    _option(
        SCORING,
        "CausalLM label tokens, each exactly one token; repeat the flag: --label-tokens ' no' "
        "--label-tokens ' yes'.",
        metavar="TOKEN",
    ),
]
LabelTokenIdsOpt = Annotated[
    str | None, _option(SCORING, "CausalLM label token ids, e.g. 2152,9693.", metavar="IDS")
]
ApplySoftmaxOpt = Annotated[
    bool | None,
    _option(
        SCORING,
        "Softmax over the label logits (CausalLM) or the class logits (classifier) in scores.",
        "--apply-softmax/--no-apply-softmax",
    ),
]
ActivationOpt = Annotated[
    choices.ActivationChoice | None,
    _option(
        SCORING,
        "How score is made from a classifier's logits (scores stays raw): auto (as sentence-transformers' "
        "CrossEncoder: the model's activation_fn, else sigmoid for one label, else the softmax probability of "
        "the --score-index class), none (the raw value), sigmoid or softmax.",
        show_default="auto",
    ),
]
LabelScoreOpt = Annotated[
    choices.LabelScore | None,
    _option(
        SCORING,
        "CausalLM label scores: probability (P(label) over the vocabulary, or over the labels with "
        "--apply-softmax), logit (the label token's raw logit, as FlagEmbedding's LLM rerankers return it) or "
        "sigmoid (of that logit: FlagEmbedding's normalize=True).",
        show_default="probability",
    ),
]
ScoreIndexOpt = Annotated[
    int | None, _option(SCORING, "Which entry of scores becomes score.", show_default="-1, the last")
]
PooledOpt = Annotated[
    bool | None,
    _option(
        OUTPUT,
        "Also write each item's final hidden state (LAST pooling, after the final norm), in the column "
        "pooled_hidden_state.",
        "--pooled-hidden-states",
    ),
]
NormalizeOpt = Annotated[
    bool | None, _option(OUTPUT, "L2-normalize the pooled hidden states.", "--normalize")
]
QueryTemplateOpt = Annotated[str | None, _option(SCORING, "Template around each query, with {query}.")]
ItemTemplateOpt = Annotated[str | None, _option(SCORING, "Template around each item, with {item}.")]
ItemFirstOpt = Annotated[
    bool | None, _option(SCORING, "Reference sequence is item then query (runs unpacked).", "--item-first")
]
PackingOpt = Annotated[
    choices.Packing | None,
    _option(
        SCORING,
        "mis: one packed sequence per query; single: one sequence per pair; auto: mis when the "
        "model allows it (decoders), else single (encoders, recurrent layers).",
        show_default="auto",
    ),
]
DelimiterOpt = Annotated[
    int | None,
    _option(SCORING, "Delimiter id between packed items.", show_default="9999, or pad/eos when out of range"),
]
MaxQueryTokensOpt = Annotated[
    int | None, _option(SCORING, "Longest query, in tokens.", show_default="what the pack allows")
]
MaxItemTokensOpt = Annotated[
    int | None, _option(SCORING, "Longest item, in tokens.", show_default="what the pack allows")
]
TruncateOpt = Annotated[
    choices.Truncate | None,
    _option(
        SCORING,
        "Over-long input: error (a row error), item-tail (cut the item's end), query-head (cut the "
        "query's start), longest-first (CrossEncoder's rule: cut the longer of query and item), chunk (score "
        "an over-long item as chunks of --max-item-tokens, one output row per item: see --chunk-aggregate).",
        show_default="error",
    ),
]
ChunkOverlapOpt = Annotated[
    int | None,
    _option(
        SCORING, "With --truncate chunk: tokens each chunk shares with the one before it.", show_default="0"
    ),
]
ChunkAggregateOpt = Annotated[
    choices.ChunkAggregate | None,
    _option(
        SCORING,
        "With --truncate chunk: the item's score is its best chunk's (max; that chunk also gives "
        "scores and the pooled vector), its first chunk's, or the mean of every column.",
        show_default="max",
    ),
]
TopKOpt = Annotated[
    int | None,
    _option(OUTPUT, "Keep the N best items of each query, best first, with a rank column.", metavar="N"),
]
RankOpt = Annotated[
    bool, _option(OUTPUT, "Add a rank column (1 = best); each query's items come out best first.", "--rank")
]
DeviceOpt = Annotated[choices.Device, _option(ENGINE, "Where to run.")]
DtypeOpt = Annotated[choices.Dtype, _option(ENGINE, "auto: bf16 on CUDA, fp32 on CPU.")]
BackendOpt = Annotated[
    choices.Backend, _option(ENGINE, "Attention: sdpa is the reference; flashinfer needs CUDA.")
]
MaxBatchTokensOpt = Annotated[
    int | None,
    _option(ENGINE, "Tokens per forward pass.", show_default="4096 on CPU, 65536 on CUDA"),
]
MaxPackTokensOpt = Annotated[int, _option(ENGINE, "Longest packed sequence; larger groups are split.")]
TrustRemoteCodeOpt = Annotated[
    bool, _option(ENGINE, "Allow model code from the model directory.", "--trust-remote-code")
]
AllowPickleOpt = Annotated[
    bool, _option(ENGINE, "Allow pickle (.bin) weights, which can run code when loaded.", "--allow-pickle")
]
CompileOpt = Annotated[
    bool,
    _option(
        ENGINE,
        "torch.compile the decoder layers' norms, MLPs and attention projections + RoPE into fused "
        "kernels (the first batches compile, for seconds to minutes; every batch size reuses them).",
        "--compile",
    ),
]
LayersOpt = Annotated[
    choices.Layers,
    _option(
        ENGINE,
        "Decoder layers: native (our own fused Llama/Mistral/Qwen2/Qwen3 layers) or transformers' "
        "modeling code; auto: native when the model's config is fully implemented there (else one log line "
        "says why not).",
    ),
]
OpsOpt = Annotated[
    choices.Ops,
    _option(
        ENGINE,
        "Element-wise kernels of native layers (RMSNorm + residual, RoPE, SiLU·mul); auto: flashinfer "
        "on CUDA when installed, torch elsewhere.",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    _option(ENGINE, "Torch threads.", show_default="the CPUs this process may use (affinity, cgroup quota)"),
]
WindowRowsOpt = Annotated[int, _option(JOB, "Input rows held in memory and checkpointed at a time.")]
OnErrorOpt = Annotated[
    choices.OnError,
    _option(JOB, "A row that cannot be scored: fail (exit 2), record (error column), skip (errors file)."),
]
ErrorsFileOpt = Annotated[
    str | None,
    _option(
        JOB,
        "Where --on-error skip lists skipped rows.",
        metavar="FILE",
        show_default="OUTPUT.errors.jsonl; with -o -, stderr",
    ),
]
MaxFailedRateOpt = Annotated[
    float | None,
    _option(
        JOB,
        "Fail the run (exit 4, after its output is written) when more than this fraction of its items "
        "failed (0: any; 1: never).",
        metavar="RATE",
        show_default="fail only when every item failed",
    ),
]
ResumeOpt = Annotated[bool, _option(JOB, "Continue a killed run from its checkpointed parts.", "--resume")]
OverwriteOpt = Annotated[bool, _option(JOB, "Replace an existing output (and stale parts).", "--overwrite")]
ReportOpt = Annotated[
    str | None,
    _option(
        JOB, "Write a JSON run report to this file (- for stderr), however the run ends.", metavar="FILE"
    ),
]
DryRunOpt = Annotated[
    bool, _option(JOB, "Read and plan without loading the model; print the counts.", "--dry-run")
]
QuietOpt = Annotated[
    bool,
    _option(
        JOB,
        "No progress and no summary; warnings (skipped or failed rows) and errors still show.",
        "-q",
        "--quiet",
    ),
]
PipelineOpt = Annotated[
    bool,
    _option(
        ENGINE,
        "Read and plan the next window on a worker thread while the current one is scored.",
        "--pipeline/--no-pipeline",
    ),
]
ProgressSecondsOpt = Annotated[
    float,
    _option(
        JOB,
        "When stderr is not a terminal: a progress log line (rows, items/s, ETA) every N seconds.",
        metavar="N",
    ),
]
PricePerHourOpt = Annotated[
    float | None,
    _option(
        JOB,
        "The machine's price per hour (any currency): the report's usage then gives the run's cost and "
        "the cost per million items.",
        metavar="PRICE",
    ),
]
ReuseOpt = Annotated[
    list[str] | None,
    _option(
        JOB,
        "Earlier score-batch outputs, as INPUT takes them (files, partitioned directories, globs, s3://…; "
        "repeatable or comma-separated): pairs whose score key matches (same query, item, model content and "
        "scoring settings) copy their score, scores and pooled vectors bit for bit; only the rest is scored "
        "(docs/operations.md).",
        "--reuse",
        metavar="PATH|URI",
    ),
]
ReuseMissingOkOpt = Annotated[
    bool,
    _option(
        JOB,
        "A --reuse output that is not there (the earlier run failed) is a warning, and its pairs are "
        "scored, instead of exit 2.",
        "--reuse-missing-ok",
    ),
]
LogFormatOpt = Annotated[
    choices.LogFormat, _option(JOB, "Log lines on stderr: text or json (one object per line).")
]
RayOpt = Annotated[
    bool,
    _option(
        RAY, "Run on Ray Data: -o names a directory of Parquet files (with a row_index column).", "--ray"
    ),
]
RayAddressOpt = Annotated[
    str | None,
    _option(
        RAY,
        "Ray cluster to join: auto (the running cluster) or ray://host:port.",
        metavar="ADDRESS",
        show_default="a local Ray",
    ),
]
NumWorkersOpt = Annotated[int, _option(RAY, "Scoring actors, each holding one loaded model.")]
GpusPerWorkerOpt = Annotated[
    float | None, _option(RAY, "GPUs per actor.", show_default="1 when the cluster has GPUs, else 0")
]
CpusPerWorkerOpt = Annotated[float, _option(RAY, "CPUs per actor (also its torch threads).")]


@dataclass(frozen=True)
class ScoreOptions:
    """One invocation's flags, typed; the `score` command's parameters are these fields, in this order."""

    input: InputArg
    output: OutputOpt = "scores.parquet"
    storage_option: StorageOpt = None
    model: ModelOpt = None
    profile: ProfileOpt = None
    query_col: QueryColOpt = None
    item_col: ItemColOpt = None
    items_col: ItemsColOpt = None
    query_id_col: QueryIdColOpt = None
    item_id_col: ItemIdColOpt = None
    keep_columns: KeepColumnsOpt = None
    input_format: InputFormatOpt = "auto"
    hive_types: HiveTypesOpt = "infer"
    partition_by: PartitionByOpt = None
    label_tokens: LabelTokensOpt = None
    label_token_ids: LabelTokenIdsOpt = None
    apply_softmax: ApplySoftmaxOpt = None
    activation: ActivationOpt = None
    label_score: LabelScoreOpt = None
    score_index: ScoreIndexOpt = None
    pooled_hidden_states: PooledOpt = None
    normalize: NormalizeOpt = None
    query_template: QueryTemplateOpt = None
    item_template: ItemTemplateOpt = None
    item_first: ItemFirstOpt = None
    packing: PackingOpt = None
    delimiter_token_id: DelimiterOpt = None
    max_query_tokens: MaxQueryTokensOpt = None
    max_item_tokens: MaxItemTokensOpt = None
    truncate: TruncateOpt = None
    chunk_overlap: ChunkOverlapOpt = None
    chunk_aggregate: ChunkAggregateOpt = None
    top_k: TopKOpt = None
    rank: RankOpt = False
    device: DeviceOpt = "auto"
    dtype: DtypeOpt = "auto"
    backend: BackendOpt = "auto"
    max_batch_tokens: MaxBatchTokensOpt = None
    max_pack_tokens: MaxPackTokensOpt = 8192
    trust_remote_code: TrustRemoteCodeOpt = False
    allow_pickle: AllowPickleOpt = False
    compile: CompileOpt = False
    layers: LayersOpt = "auto"
    ops: OpsOpt = "auto"
    threads: ThreadsOpt = None
    window_rows: WindowRowsOpt = DEFAULT_WINDOW_ROWS
    on_error: OnErrorOpt = "fail"
    errors_file: ErrorsFileOpt = None
    max_failed_rate: MaxFailedRateOpt = None
    resume: ResumeOpt = False
    overwrite: OverwriteOpt = False
    report: ReportOpt = None
    dry_run: DryRunOpt = False
    quiet: QuietOpt = False
    pipeline: PipelineOpt = True
    progress_seconds: ProgressSecondsOpt = 30.0
    price_per_hour: PricePerHourOpt = None
    reuse: ReuseOpt = None
    reuse_missing_ok: ReuseMissingOkOpt = False
    log_format: LogFormatOpt = "text"
    ray: RayOpt = False
    ray_address: RayAddressOpt = None
    num_workers: NumWorkersOpt = 1
    gpus_per_worker: GpusPerWorkerOpt = None
    cpus_per_worker: CpusPerWorkerOpt = 1.0


@dataclass(frozen=True)
class RunBatchOptions(ScoreOptions):
    """`run-batch`'s flags: score's, with vLLM's spelling of the batch file and the output (both required)."""

    input: InputFileOpt  # type: ignore[assignment] - one batch file, not a list of inputs
    output: OutputFileOpt = field()  # field(): no default (score's would be inherited)
