"""The CLI at the goal shape per --window-rows beside the forward alone of the same groups (bench/gpu_profile.py's
cli step): text rows in a Parquet file to a Parquet output, in this process (imports paid once), the settings auto
resolves; each time the report's seconds_total - seconds_load - seconds_import, as gpu.py's pipeline method."""

from __future__ import annotations

import tempfile
from pathlib import Path

from common import LABELS, Shape, best_of, text_workload


def cli_rows(model_dir: Path, args) -> dict:
    """{"window_rows=N": CLI figures, "forward": the forward alone} on --cli-queries queries of the goal shape."""
    import gpu
    from e2e_cpu import write_workload
    from transformers import AutoTokenizer

    shape = Shape(args.cli_queries, args.items, args.query_tokens, args.item_tokens)
    groups = text_workload(AutoTokenizer.from_pretrained(model_dir), shape, seed=1)
    items = sum(len(g.items) for g in groups)
    labels = [flag for label in LABELS for flag in ("--label-tokens", label)]
    result: dict = {}
    resolved = None
    with tempfile.TemporaryDirectory() as tmp:
        data, out, report = (Path(tmp) / name for name in ("in.parquet", "out.parquet", "report.json"))
        write_workload(groups, data)
        for window in args.window_rows:
            command = [str(data), "-o", str(out), "--report", str(report), "--model", str(model_dir), *labels,
                       "--device", args.device, "--dtype", args.dtype, "--overwrite", "--quiet",
                       "--window-rows", str(window)]  # fmt: skip
            after, best = gpu.cli_runs(command, report, max(1, args.repeats - 1))
            resolved = {k: best.get(k) for k in ("backend", "layers", "ops", "dtype")}
            result[f"window_rows={window}"] = {
                "items": items,
                "seconds_runs": [round(t, 3) for t in after],
                "items_per_s": round(items / min(after), 1),
                "median_items_per_s": round(items / sorted(after)[len(after) // 2], 1),
                "seconds_scoring": best.get("seconds_scoring"),
                "resolved": resolved,
            }
    result["forward"] = _forward_alone(model_dir, args, groups, resolved)
    for key, row in result.items():
        if key != "forward":
            row["of_forward"] = round(row["items_per_s"] / result["forward"]["items_per_s"], 3)
    return result


def _forward_alone(model_dir: Path, args, groups, resolved: dict | None) -> dict:
    """Scorer.run of a ready plan of the same groups with the CLI's resolved settings and batch budget."""
    import gpu

    resolved = resolved or {}
    ops = resolved.get("ops") if resolved.get("ops") not in (None, "none") else "auto"
    method = gpu.Method(resolved.get("backend") or "auto", layers=resolved.get("layers") or "auto", ops=ops)
    scorer = gpu._scorer(model_dir, method, args.device, args.dtype, None)
    plan = scorer.plan(groups)
    scorer.run(plan)  # warm-up
    _, seconds = best_of(args.repeats, gpu._synced, scorer.run, plan)
    items = sum(len(g.items) for g in groups)
    return {"items": items, "batches": len(plan.batches), "seconds": round(seconds, 4),
            "items_per_s": round(items / seconds, 1)}  # fmt: skip
