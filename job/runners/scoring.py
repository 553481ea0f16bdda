"""The one scoring loop's steps for local windows, Ray batches and batch files: a window → its keys, copied
pairs, the groups left → plan → run → an output part (part schema) and its ScoredWindow."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa

from score_batch.engine.plan.planner import Planner, PlanStats, WorkPlan
from score_batch.engine.run.packed_runner import PlanRun
from score_batch.engine.run.results import Finished, planned_results
from score_batch.io_formats.columns import ERROR, SCORE
from score_batch.io_formats.window import Window
from score_batch.job.preflight.contract import OutputContract
from score_batch.job.reuse import EarlierScores, JoinedScores, ScoredPairs
from score_batch.job.runners.phase import ScoredWindow
from score_batch.job.windows import (
    WindowGroups,
    empty_counts,
    group_sizes,
    group_window,
    output_columns,
    pair_keys,
    without,
)


@dataclass(frozen=True)
class WindowTools:
    """What scoring a window needs besides the window: made once the tokenizer is there."""

    planner: Planner
    contract: OutputContract  # the run's output (job/preflight/checks.run_contract)
    score_key: bytes | None  # RunIdentity.score_key: what every pair's key is keyed with (None: no keys)
    earlier: EarlierScores | JoinedScores | None  # --reuse: the earlier outputs' values for this run's pairs
    pairs: ScoredPairs  # the values of pairs written by earlier windows (or batches) of this run


@dataclass(frozen=True)
class Prepared:
    """One window made ready to score: its groups, score keys, copied values, and (once planned) its plan."""

    number: int  # the window's place in the run (local runs: its checkpoint part)
    window: Window
    grouped: WindowGroups  # every readable pair
    todo: WindowGroups  # the pairs to score: grouped less the copied ones
    reused: dict  # window item index → values copied from an earlier output (--reuse)
    copies: dict  # window item index → values of the same pair in an earlier window of this run
    keys: list  # [items] each pair's score key
    plan: WorkPlan | None = None
    digest: str = (
        ""  # a local run's digest of its input up to this window (job/checkpoint/input_digest): its check
    )
    reuse_incomplete: int = 0  # pairs an earlier output held without every value this run writes: scored


def prepare(number: int, window: Window, tools: WindowTools) -> Prepared:
    """Group and key a window, taking out the pairs copied from --reuse's earlier outputs and from this run."""
    tools.contract.check_window(window)  # --partition-by: names the output's directories can take
    grouped = group_window(window)
    keys = [None] * window.num_items if tools.score_key is None else pair_keys(window, tools.score_key)
    reused, incomplete = ({}, 0) if tools.earlier is None else tools.earlier.take(window, keys)
    copies = tools.pairs.take(without(grouped, reused), keys)
    todo = without(grouped, reused | copies)
    return Prepared(number, window, grouped, todo, reused, copies, keys, reuse_incomplete=incomplete)


def planned(prepared: Prepared, tools: WindowTools) -> Prepared:
    """The window with its plan; repeats of pairs written while it was prepared are copied, not planned."""
    late = tools.pairs.take(prepared.todo, prepared.keys)
    if late:
        todo = without(prepared.todo, late)
        prepared = dataclasses.replace(prepared, todo=todo, copies=prepared.copies | late, plan=None)
    if prepared.plan is None:
        prepared = dataclasses.replace(prepared, plan=tools.planner.plan(prepared.todo.groups))
    return prepared


def score_window(
    prepared: Prepared, tools: WindowTools, scorer, advance=None
) -> tuple[pa.Table, ScoredWindow]:
    """THE loop's step for a local window and a Ray batch alike: a prepared window planned (`planned`), run into
    its output part (`score`), its pairs remembered for later repeats; advance(items): progress."""
    prepared = planned(prepared, tools)
    if advance is not None:
        advance(len(prepared.reused) + len(prepared.copies))  # copied pairs are done already
    part, scored = score(prepared, tools, scorer, advance)
    tools.pairs.add(part)
    return part, scored


def score(prepared: Prepared, tools: WindowTools, scorer, advance=None) -> tuple[pa.Table, ScoredWindow]:
    """Run a planned window (scorer None: a dry run's NaN scores) into its output part and its ScoredWindow."""
    plan, pooled_dim = prepared.plan, tools.contract.pooled_dim
    results = planned_results(plan, pooled_dim) if scorer is None else scorer.run(plan, advance)
    return window_part(prepared, tools, results, plan.stats)


def start(prepared: Prepared, tools: WindowTools, scorer, advance=None) -> PlanRun | Finished:
    """A planned window's plan started on the device (Scorer.start: its first batch launched; launch_rest and
    results go on); a dry run's (scorer None) NaN scores, finished at once."""
    if scorer is None:
        return Finished(planned_results(prepared.plan, tools.contract.pooled_dim))
    return scorer.start(prepared.plan, advance)


def window_part(
    prepared: Prepared, tools: WindowTools, results: list, stats: PlanStats
) -> tuple[pa.Table, ScoredWindow]:
    """A window's results (its plan's stats beside them) as its output part and its ScoredWindow."""
    contract, window = tools.contract, prepared.window
    copied = prepared.reused | prepared.copies
    part = contract.part_table(
        output_columns(window, prepared.todo, results, contract, prepared.keys, copied)
    )
    empty_queries, empty_items = empty_counts(window)
    scored = ScoredWindow(
        window.num_rows,
        part.num_rows,
        part.num_rows - part[ERROR].null_count,
        stats,
        part[SCORE],
        group_sizes(window, prepared.grouped, contract.query_ids_given),
        reused=len(prepared.reused),
        reuse_incomplete=prepared.reuse_incomplete,
        duplicates=len(prepared.copies),
        empty_queries=empty_queries,
        empty_items=empty_items,
    )
    return part, scored
