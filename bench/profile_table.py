"""Kernel tables from a torch.profiler Chrome trace: per kernel count, total and mean time and share of the device's
busy time; the device's idle share; host calls over a threshold. Pure Python on the trace's JSON, so the CPU suite
proves it on a CPU trace (its top-level aten ops standing in for kernels)."""

from __future__ import annotations

import re
from collections import defaultdict

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")  # what runs on the device in a kineto trace
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")  # host work: torch ops and CUDA API calls
HOST_THRESHOLD_US = 200.0
NAME_CHARS = 160  # kernel names are C++ templates of several KB: the table keeps their start
# Kernel classes, first match wins: where a forward's device time goes.
CLASSES = (
    ("attention", r"BatchPrefill|Prefill|flash|fmha|attention"),
    ("qk_norm_rope", r"qk_norm_rope"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|wgmma|matmul"),
    ("norm", r"[Rr]ms[Nn]orm|[Nn]orm"),
    ("rope", r"[Rr]ope|rotary"),
    ("silu_mul", r"silu|act_and_mul|[Aa]ct[A-Z]"),
    ("copy", r"[Mm]emcpy|[Mm]emset|copy|Copy|cat_|CatArray"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|Reduce|index|gather|scatter"),
)


def trace_events(trace: dict) -> list[dict]:
    """The complete ('X') events of a Chrome trace that have a duration (µs) and a category."""
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and e.get("cat")]


def kernel_class(name: str) -> str:
    """The class of a kernel by its name (CLASSES), 'other' when none matches."""
    return next((label for label, pattern in CLASSES if re.search(pattern, name)), "other")


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by the union of (start, end) intervals."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def top_level(events: list[dict]) -> list[dict]:
    """Events not inside another of the list on the same thread (a parent op's children left out)."""
    kept = []
    by_thread = defaultdict(list)
    for event in events:
        by_thread[(event.get("pid"), event.get("tid"))].append(event)
    for thread in by_thread.values():
        end = float("-inf")
        for event in sorted(thread, key=lambda e: (e["ts"], -e["dur"])):
            if event["ts"] >= end:
                kept.append(event)
                end = event["ts"] + event["dur"]
    return kept


def kernel_table(
    events: list[dict], categories=DEVICE_CATEGORIES, wall_us: float | None = None, nested: bool = True
) -> dict:
    """Per kernel name: count, total and mean µs, share of the device's busy time; per class the same totals;
    the device's busy and idle shares over its span (first kernel start to last kernel end) and, given the
    forward's wall time, the busy share of that wall. nested=False keeps top-level events only (a CPU trace)."""
    device = [e for e in events if e["cat"] in categories]
    if not nested:
        device = top_level(device)
    busy = union_us([(e["ts"], e["ts"] + e["dur"]) for e in device])
    span = (max(e["ts"] + e["dur"] for e in device) - min(e["ts"] for e in device)) if device else 0.0
    rows: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    for event in device:
        name = event["name"]
        for table, key in ((rows, name), (classes, kernel_class(name))):
            row = table.setdefault(key, {"count": 0, "total_us": 0.0})
            row["count"] += 1
            row["total_us"] += event["dur"]
    kernel_sum = sum(row["total_us"] for row in rows.values())
    for table in (rows, classes):
        for row in table.values():
            row["mean_us"] = round(row["total_us"] / row["count"], 2)
            row["share"] = round(row["total_us"] / kernel_sum, 4) if kernel_sum else 0.0
            row["total_us"] = round(row["total_us"], 1)
    ordered = sorted(rows.items(), key=lambda kv: -kv[1]["total_us"])
    return {
        "kernels": [{"name": name[:NAME_CHARS], "class": kernel_class(name), **row} for name, row in ordered],
        "classes": dict(sorted(classes.items(), key=lambda kv: -kv[1]["total_us"])),
        "launches": len(device),
        "kernel_us": round(kernel_sum, 1),
        "busy_us": round(busy, 1),
        "span_us": round(span, 1),
        "idle_share_of_span": round(1 - busy / span, 4) if span else None,
        "wall_us": None if wall_us is None else round(wall_us, 1),
        "busy_share_of_wall": round(busy / wall_us, 4) if wall_us else None,
    }


def host_calls(
    events: list[dict], threshold_us: float = HOST_THRESHOLD_US, categories=HOST_CATEGORIES
) -> list:
    """Host calls (torch ops, CUDA runtime and driver calls) longer than threshold_us, grouped by name: count,
    total and longest µs, and whether any was top-level on its thread (not inside another host call)."""
    host = [e for e in events if e["cat"] in categories]
    outer = {id(e) for e in top_level(host)}
    grouped: dict[tuple[str, str], dict] = {}
    for event in host:
        if event["dur"] <= threshold_us:
            continue
        row = grouped.setdefault(
            (event["cat"], event["name"]), {"count": 0, "total_us": 0.0, "max_us": 0.0, "top_level": False}
        )
        row["count"] += 1
        row["total_us"] += event["dur"]
        row["max_us"] = max(row["max_us"], event["dur"])
        row["top_level"] |= id(event) in outer
    return [
        {
            "category": cat,
            "name": name[:NAME_CHARS],
            **row,
            "total_us": round(row["total_us"], 1),
            "max_us": round(row["max_us"], 1),
        }  # fmt: skip
        for (cat, name), row in sorted(grouped.items(), key=lambda kv: -kv[1]["total_us"])
    ]


def annotation_us(events: list[dict], name: str) -> float | None:
    """The wall µs of the record_function region `name` (its longest occurrence), None when absent."""
    spans = [e["dur"] for e in events if e["cat"] == "user_annotation" and e["name"] == name]
    return max(spans) if spans else None


def profile_summary(trace: dict, region: str, nested: bool = True, categories=DEVICE_CATEGORIES) -> dict:
    """The kernel table and host calls of a trace whose forward ran inside record_function(region)."""
    events = trace_events(trace)
    table = kernel_table(events, categories, annotation_us(events, region), nested)
    table["host_calls_over_200us"] = host_calls(events)
    return table


def format_table(table: dict, limit: int = 30) -> list[str]:
    """The text form of kernel_table's result: the classes, then the top kernels, then the long host calls."""
    ms = 1e-3
    lines = [
        f"device: {table['launches']} launches, kernels {table['kernel_us'] * ms:.2f} ms, busy "
        f"{table['busy_us'] * ms:.2f} ms over a span of {table['span_us'] * ms:.2f} ms (idle share "
        f"{_fmt(table['idle_share_of_span'])}); forward wall {_fmt(table['wall_us'], ms, '.2f')} ms, busy share "
        f"of it {_fmt(table['busy_share_of_wall'])}",
        f"  {'class':14} {'count':>6} {'total ms':>9} {'mean µs':>9} {'share':>6}",
    ]
    for name, row in table["classes"].items():
        lines.append(_row(name, row))
    lines.append(
        f"  {'kernel (first ' + str(limit) + ')':60} {'count':>6} {'total ms':>9} {'mean µs':>9} {'share':>6}"
    )
    for row in table["kernels"][:limit]:
        lines.append(_row(row["name"][:60], row, 60))
    calls = table.get("host_calls_over_200us", [])
    lines.append(f"  host calls over {HOST_THRESHOLD_US:.0f} µs: {len(calls)} names")
    for row in calls[:limit]:
        where = "top" if row["top_level"] else "nested"
        lines.append(
            f"    {row['category']:12} {row['name'][:60]:60} ×{row['count']:<4} total {row['total_us'] * ms:8.2f} ms, "
            f"max {row['max_us'] * ms:7.2f} ms ({where})"
        )
    return lines


def _row(name: str, row: dict, width: int = 14) -> str:
    return f"  {name:{width}} {row['count']:6d} {row['total_us'] * 1e-3:9.3f} {row['mean_us']:9.1f} {row['share']:6.3f}"


def _fmt(value, scale: float = 1.0, spec: str = ".3f") -> str:
    return "—" if value is None else format(value * scale, spec)
