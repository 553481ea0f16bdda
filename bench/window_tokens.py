"""Tokens the forward runs when windows are cut between query groups, against windows cut at fixed row counts
(a query whose rows straddle a cut runs its prefix twice) and against the packs' own (the whole input one window:
every query once), from dry runs' plans (the report's packed_tokens; no weights).

    python bench/window_tokens.py [--window-rows 2048] [--shapes 1500x40x100x64 3000x40x30x213]

A shape is QUERY_TOKENSxITEM_TOKENSxITEMS_PER_QUERYxQUERIES (the goal shape: 1,500-token queries with 100
items of 40 tokens, 64 queries; the long-query shape: 3,000-token queries with 30 items each); lengths are
about those (±15%), in the tests' byte-level BPE tokenizer. "fixed" is today's reader with its cut replaced
(bench only) by one every --window-rows rows.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.host_path import one_layer_classifier, write_input  # noqa: E402
from score_batch.engine import EngineConfig  # noqa: E402
from score_batch.io_formats import readers  # noqa: E402
from score_batch.io_formats.schema import ColumnOverrides  # noqa: E402
from score_batch.job import RunConfig, run  # noqa: E402


@contextlib.contextmanager
def fixed_cuts():
    """The reader's cut at every window_rows rows, groups or not (bench only: windows as fixed row counts)."""
    original = readers.cuts

    def every(window, window_rows: int, final: bool) -> list[int]:
        ends = list(range(window_rows, window.num_rows + 1, window_rows))
        return ends + [window.num_rows] if final and (not ends or ends[-1] < window.num_rows) else ends

    readers.cuts = every
    try:
        yield
    finally:
        readers.cuts = original


def packed_tokens(model_dir: Path, data: Path, out: Path, window_rows: int) -> tuple[int, int]:
    """(tokens the plans run, items) of a dry run."""
    config = RunConfig(
        input=str(data), output=str(out), model_dir=model_dir, columns=ColumnOverrides(),
        engine=EngineConfig(device="cpu"), dry_run=True, quiet=True, overwrite=True, window_rows=window_rows,
    )  # fmt: skip
    report = run(config)
    return report.packed_tokens, report.items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window-rows", type=int, default=2048)
    parser.add_argument("--shapes", nargs="+", default=["1500x40x100x64", "3000x40x30x213"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer, model_dir = one_layer_classifier(tmp / "model")
        for shape in args.shapes:
            query_tokens, item_tokens, per_query, queries = (int(n) for n in shape.split("x"))
            data = tmp / f"in-{shape}.parquet"
            write_input(data, tokenizer, per_query * queries, per_query, query_tokens, item_tokens)
            out = tmp / "out.parquet"
            with fixed_cuts():
                fixed, items = packed_tokens(model_dir, data, out, args.window_rows)
            grouped, _ = packed_tokens(model_dir, data, out, args.window_rows)
            own, _ = packed_tokens(model_dir, data, out, per_query * queries)  # one window: each query once
            print(
                f"{shape} ({items:,} items, --window-rows {args.window_rows}): fixed cuts {fixed:,} tokens "
                f"({fixed / own - 1:+.2%} over the packs' own), group cuts {grouped:,} ({grouped / own - 1:+.2%}), "
                f"the packs' own {own:,}"
            )


if __name__ == "__main__":
    main()
