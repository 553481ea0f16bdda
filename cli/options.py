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

COLUMNS = "Input columns"
SCORING = "Scoring"
ENGINE = "Engine"
JOB = "Batch job"
RAY = "Scale-out on Ray (pip install -e '.\\[ray]')"

DEFAULT_WINDOW_ROWS = 2048  # RunConfig's default; a test keeps them equal

InputArg = Annotated[
    list[str],
    typer.Argument(
        help="One or more inputs, read in order: .parquet, .jsonl, .jsonl.gz or .jsonl.zst files, directories "
        "(with key=value partition directories) or globs; local paths or file://, s3://, gs://, https://, "
        "hf:// URIs; or - (JSONL on stdin). One argument may list several, separated by commas.",
        show_default=False,
    ),
]
InputFileOpt = Annotated[
    str,
    typer.Option(
        "-i",
        "--input-file",
        help="The batch file: JSONL of /v1/score and /v1/rerank requests (vLLM's run-batch format), or - for "
        "stdin.",
        show_default=False,
    ),
]
OutputOpt = Annotated[
    str,
    typer.Option(
        "-o",
        "--output",
        help="A .parquet or .jsonl path (local, file://, s3://, gs://), or - for JSONL on stdout.",
    ),
]
OutputFileOpt = Annotated[
    str,
    typer.Option(
        "-o", "--output", "--output-file", help="The output JSONL file, or - for stdout.", show_default=False
    ),
]
StorageOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        help="key=value for the object-store filesystem, repeatable: endpoint_override=host:9000, region=…, "
        "scheme=http (credentials come from the standard chain, never from here).",
        show_default=False,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="A local model directory, or a hub id (org/name) already in the Hugging Face cache; "
        "nothing is downloaded \\[default: the bundled demo reranker].",
        show_default=False,
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        help="Scoring profile: a built-in name (see `score-batch models`) or a JSON file. Default: the "
        "model's score_batch.json, else a built-in profile matching the model's name. Flags override it.",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]


def _column(help: str) -> typer.models.OptionInfo:
    """An input-column option."""
    return typer.Option(help=help, rich_help_panel=COLUMNS, show_default=False)


QueryColOpt = Annotated[str | None, _column("Query column (default: query, or query_tokens).")]
ItemColOpt = Annotated[str | None, _column("Item column of the long layout (default: item, or item_tokens).")]
ItemsColOpt = Annotated[
    str | None, _column("List-of-items column of the nested layout (default: items, or items_tokens).")
]
QueryIdColOpt = Annotated[str | None, _column("Query id column (default: query_id if present).")]
ItemIdColOpt = Annotated[str | None, _column("Item id column (long: item_id; nested: item_ids).")]
KeepColumnsOpt = Annotated[str | None, _column("Comma-separated input columns to copy to the output.")]
InputFormatOpt = Annotated[
    choices.RequestedFormat,
    typer.Option(
        help="table (query/item rows), openai-batch (vLLM-style /v1/score and /v1/rerank batch file, as "
        "`score-batch run-batch`), or auto (openai-batch when the lines are batch requests).",
        rich_help_panel=COLUMNS,
    ),
]
HiveTypesOpt = Annotated[
    choices.HiveTypes,
    typer.Option(
        help="Values of key=value partition directories: infer (integers, dates, … as DuckDB and polars type "
        "them) or string (keep the text).",
        rich_help_panel=COLUMNS,
    ),
]
PartitionByOpt = Annotated[
    str | None,
    typer.Option(
        help="Write OUTPUT as a directory of Parquet files partitioned (hive style, col=value/) by these "
        "comma-separated output columns (ids or kept columns).",
        rich_help_panel=JOB,
        show_default=False,
    ),
]
LabelTokensOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="CausalLM label tokens, each exactly one token; repeat the flag: --label-tokens ' no' "
        "--label-tokens ' yes'.",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
LabelTokenIdsOpt = Annotated[
    str | None,
    typer.Option(
        help="CausalLM label token ids, e.g. 2152,9693.", rich_help_panel=SCORING, show_default=False
    ),
]
ApplySoftmaxOpt = Annotated[
    bool | None,
    typer.Option(
        "--apply-softmax/--no-apply-softmax",
        help="Softmax over the label logits (CausalLM) or the class logits (classifier) in scores.",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
ActivationOpt = Annotated[
    choices.ActivationChoice | None,
    typer.Option(
        help="How score is made from a classifier's logits (scores stays raw): auto (as sentence-transformers' "
        "CrossEncoder: the model's activation_fn, else sigmoid for one label, else the softmax probability of "
        "the --score-index class), none (the raw value), sigmoid or softmax \\[default: auto].",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
LabelScoreOpt = Annotated[
    choices.LabelScore | None,
    typer.Option(
        help="CausalLM label scores: probability (P(label) over the vocabulary, or over the labels with "
        "--apply-softmax), logit (the label token's raw logit, as FlagEmbedding's LLM rerankers return it) or "
        "sigmoid (of that logit: FlagEmbedding's normalize=True) \\[default: probability].",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
ScoreIndexOpt = Annotated[
    int | None,
    typer.Option(
        help="Which entry of scores becomes score \\[default: -1, the last].",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
PooledOpt = Annotated[
    bool | None,
    typer.Option(
        "--pooled-hidden-states",
        help="Also write each item's final hidden state (LAST pooling, after the final norm).",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
NormalizeOpt = Annotated[
    bool | None,
    typer.Option(
        "--normalize",
        help="L2-normalize the pooled hidden states.",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
QueryTemplateOpt = Annotated[
    str | None,
    typer.Option(
        help="Template around each query, with {query}.", rich_help_panel=SCORING, show_default=False
    ),
]
ItemTemplateOpt = Annotated[
    str | None,
    typer.Option(help="Template around each item, with {item}.", rich_help_panel=SCORING, show_default=False),
]
ItemFirstOpt = Annotated[
    bool | None,
    typer.Option(
        "--item-first",
        help="Reference sequence is item then query (runs unpacked).",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
PackingOpt = Annotated[
    choices.Packing | None,
    typer.Option(
        help="mis: one packed sequence per query; single: one sequence per pair; auto: mis when the "
        "model allows it (decoders), else single (encoders, recurrent layers).",
        rich_help_panel=SCORING,
        show_default="auto",
    ),
]
DelimiterOpt = Annotated[
    int | None,
    typer.Option(
        help="Delimiter id between packed items (default 9999, or pad/eos when out of range).",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
MaxQueryTokensOpt = Annotated[
    int | None,
    typer.Option(
        help="Longest query, in tokens (default: what the pack allows).",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
MaxItemTokensOpt = Annotated[
    int | None,
    typer.Option(
        help="Longest item, in tokens (default: what the pack allows).",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
TruncateOpt = Annotated[
    choices.Truncate | None,
    typer.Option(
        help="Over-long input: error (a row error), item-tail (cut the item's end), query-head (cut the "
        "query's start), longest-first (CrossEncoder's rule: cut the longer of query and item), chunk (score "
        "an over-long item as chunks of --max-item-tokens, one output row per item: see --chunk-aggregate).",
        rich_help_panel=SCORING,
        show_default="error",
    ),
]
ChunkOverlapOpt = Annotated[
    int | None,
    typer.Option(
        help="With --truncate chunk: tokens each chunk shares with the one before it.",
        rich_help_panel=SCORING,
        show_default="0",
    ),
]
ChunkAggregateOpt = Annotated[
    choices.ChunkAggregate | None,
    typer.Option(
        help="With --truncate chunk: the item's score is its best chunk's (max; that chunk also gives "
        "scores and the pooled vector), its first chunk's, or the mean of every column.",
        rich_help_panel=SCORING,
        show_default="max",
    ),
]
TopKOpt = Annotated[
    int | None,
    typer.Option(
        help="Keep the N best items of each query, best first, with a rank column.",
        rich_help_panel=SCORING,
        show_default=False,
    ),
]
RankOpt = Annotated[
    bool,
    typer.Option(
        "--rank",
        help="Add a rank column (1 = best); each query's items come out best first.",
        rich_help_panel=SCORING,
    ),
]
DeviceOpt = Annotated[choices.Device, typer.Option(help="Where to run.", rich_help_panel=ENGINE)]
DtypeOpt = Annotated[
    choices.Dtype, typer.Option(help="auto: bf16 on CUDA, fp32 on CPU.", rich_help_panel=ENGINE)
]
BackendOpt = Annotated[
    choices.Backend,
    typer.Option(help="Attention: sdpa is the reference; flashinfer needs CUDA.", rich_help_panel=ENGINE),
]
MaxBatchTokensOpt = Annotated[
    int | None,
    typer.Option(
        help="Tokens per forward pass \\[default: 4096 on CPU, 65536 on CUDA].",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
MaxPackTokensOpt = Annotated[
    int, typer.Option(help="Longest packed sequence; larger groups are split.", rich_help_panel=ENGINE)
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code", help="Allow model code from the model directory.", rich_help_panel=ENGINE
    ),
]
AllowPickleOpt = Annotated[
    bool,
    typer.Option(
        "--allow-pickle",
        help="Allow pickle (.bin) weights, which can run code when loaded.",
        rich_help_panel=ENGINE,
    ),
]
CompileOpt = Annotated[
    bool,
    typer.Option(
        "--compile",
        help="torch.compile the decoder layers' norms, MLPs and attention projections + RoPE into fused "
        "kernels (the first batches compile, for seconds to minutes; every batch size reuses them).",
        rich_help_panel=ENGINE,
    ),
]
LayersOpt = Annotated[
    choices.Layers,
    typer.Option(
        help="Decoder layers: native (our own fused Llama/Mistral/Qwen2/Qwen3 layers) or transformers' "
        "modeling code; auto: native when the model's config is fully implemented there (else one log line says why not).",
        rich_help_panel=ENGINE,
    ),
]
OpsOpt = Annotated[
    choices.Ops,
    typer.Option(
        help="Element-wise kernels of native layers (RMSNorm + residual, RoPE, SiLU·mul); auto: flashinfer "
        "on CUDA when installed, torch elsewhere.",
        rich_help_panel=ENGINE,
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="Torch threads \\[default: the CPUs this process may use (affinity and cgroup quota)].",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
WindowRowsOpt = Annotated[
    int, typer.Option(help="Input rows held in memory and checkpointed at a time.", rich_help_panel=JOB)
]
OnErrorOpt = Annotated[
    choices.OnError,
    typer.Option(
        help="A row that cannot be scored: fail (exit 2), record (error column), skip (errors file).",
        rich_help_panel=JOB,
    ),
]
ErrorsFileOpt = Annotated[
    str | None,
    typer.Option(
        help="Where --on-error skip lists skipped rows \\[default: OUTPUT.errors.jsonl; with -o -, stderr].",
        rich_help_panel=JOB,
        show_default=False,
    ),
]
ResumeOpt = Annotated[
    bool,
    typer.Option("--resume", help="Continue a killed run from its checkpointed parts.", rich_help_panel=JOB),
]
OverwriteOpt = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace an existing output (and stale parts).", rich_help_panel=JOB),
]
ReportOpt = Annotated[
    str | None,
    typer.Option(
        help="Write a JSON run report to this file, however the run ends.",
        rich_help_panel=JOB,
        show_default=False,
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run", help="Read and plan without loading the model; print the counts.", rich_help_panel=JOB
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "-q",
        "--quiet",
        help="No progress and no summary; warnings (skipped or failed rows) and errors still show.",
        rich_help_panel=JOB,
    ),
]
PipelineOpt = Annotated[
    bool,
    typer.Option(
        "--pipeline/--no-pipeline",
        help="Read and plan the next window on a worker thread while the current one is scored.",
        rich_help_panel=JOB,
    ),
]
ProgressSecondsOpt = Annotated[
    float,
    typer.Option(
        help="When stderr is not a terminal: a progress log line (rows, items/s, ETA) every N seconds.",
        rich_help_panel=JOB,
    ),
]
PricePerHourOpt = Annotated[
    float | None,
    typer.Option(
        help="The machine's price per hour (any currency): the report's usage then gives the run's cost and "
        "the cost per million items.",
        rich_help_panel=JOB,
        show_default=False,
    ),
]
ReuseOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--reuse",
        metavar="PATH|URI",
        help="Earlier score-batch outputs, as INPUT takes them (files, partitioned directories, globs, s3://…; "
        "repeatable or comma-separated): pairs whose score key matches (same query, item, model content and "
        "scoring settings) copy their score, scores and pooled vectors bit for bit; only the rest is scored "
        "(docs/operations.md).",
        rich_help_panel=JOB,
        show_default=False,
    ),
]
ReuseMissingOkOpt = Annotated[
    bool,
    typer.Option(
        "--reuse-missing-ok",
        help="A --reuse output that is not there (the earlier run failed) is a warning, and its pairs are "
        "scored, instead of exit 2.",
        rich_help_panel=JOB,
    ),
]
LogFormatOpt = Annotated[
    choices.LogFormat,
    typer.Option(help="Log lines on stderr: text or json (one object per line).", rich_help_panel=JOB),
]
RayOpt = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Run on Ray Data: -o names a directory of Parquet files (with a row_index column).",
        rich_help_panel=RAY,
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        help="Ray cluster to join: auto (the running cluster) or ray://host:port \\[default: a local Ray].",
        rich_help_panel=RAY,
        show_default=False,
    ),
]
NumWorkersOpt = Annotated[
    int, typer.Option(help="Scoring actors, each holding one loaded model.", rich_help_panel=RAY)
]
GpusPerWorkerOpt = Annotated[
    float | None,
    typer.Option(
        help="GPUs per actor \\[default: 1 when the cluster has GPUs, else 0].",
        rich_help_panel=RAY,
        show_default=False,
    ),
]
CpusPerWorkerOpt = Annotated[
    float, typer.Option(help="CPUs per actor (also its torch threads).", rich_help_panel=RAY)
]


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
