"""bench/gpu.py's figures on the CPU: FLOP formulas against hand counts, timing boundaries on a fake clock,
peaks by exact device name, and a report that survives a failing method."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from score_batch.engine import Scorer
from score_batch.engine.plan.packing import ItemRef, attention_mask, mis_pack, single_pack

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import flops  # noqa: E402  (bench/flops.py)
import gpu  # noqa: E402  (bench/gpu.py)

# A 2-layer model small enough to count by hand.
TWO_LAYERS = dict(
    num_hidden_layers=2,
    hidden_size=8,
    intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
)


def test_dense_flops_per_token_hand_count():
    # Per layer: q 8×(2·4)=64, k 8×4=32, v 32, o (2·4)×8=64, gated MLP 3×8×16=384 → 576 weights;
    # 2 FLOPs per weight, 2 layers.
    assert flops.dense_flops_per_token(TWO_LAYERS) == 2 * 2 * 576 == 2304


def test_attended_pairs_and_attention_flops_hand_count():
    pack = mis_pack([11, 12, 13], [[21, 22], [31]], [ItemRef(0, 0), ItemRef(0, 1)], 99)
    # Query rows see 1, 2, 3 keys (6); every delimiter sees the 3 query tokens; item 1's tokens see 3+1 and
    # 3+2, item 2's token 3+1.
    delimiters = int((pack.segments == -2).sum())
    expected = 6 + 3 * delimiters + (4 + 5) + 4
    assert flops.pack_pairs(pack.segments) == expected
    assert expected == int(attention_mask(pack.segments, pack.positions).sum())  # the engine's own mask
    # QKᵀ and PV: 2·d each per pair, per query head, per layer.
    assert flops.attention_flops(TWO_LAYERS, expected) == 4 * 4 * 2 * 2 * expected
    assert flops.pack_pairs(single_pack([1, 2, 3, 4], ItemRef(0, 0)).segments) == 10 == flops.causal_pairs(4)


def test_pack_pairs_equal_the_mask_on_random_packs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        items = [list(rng.integers(1, 50, int(rng.integers(0, 9)))) for _ in range(int(rng.integers(1, 6)))]
        query = list(rng.integers(1, 50, int(rng.integers(1, 12))))
        pack = mis_pack(query, items, [ItemRef(0, i) for i in range(len(items))], 99)
        assert flops.pack_pairs(pack.segments) == int(attention_mask(pack.segments, pack.positions).sum())


def test_mfu_with_and_without_attention():
    row = flops.figures(TWO_LAYERS, tokens=100, pairs=1000, seconds=2.0, peak=1e6)
    dense, attention = 2304 * 100, 4 * 4 * 2 * 2 * 1000
    assert row["dense_flops"] == dense and row["attention_flops"] == attention
    assert row["mfu_dense"] == round(dense / 2 / 1e6, 4)
    assert row["mfu_with_attention"] == round((dense + attention) / 2 / 1e6, 4)
    assert row["attention_share"] == round(attention / (dense + attention), 4)
    assert flops.figures(TWO_LAYERS, 100, 1000, 2.0, None)["mfu_dense"] is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H100 PCIe", 756.5e12),
        ("NVIDIA H100 NVL", 835.5e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H200 NVL", 835.5e12),
        ("NVIDIA H100", None),  # no substring matches: an unknown part gets no MFU
        ("x86_64", None),
    ],
)
def test_peaks_are_keyed_by_the_exact_device_name(name, peak):
    value, source = flops.peak_flops(name)
    assert value == peak
    assert ("data sheet" in source) if peak else ("MFU not reported" in source)


class Recorder:
    """A fake clock advancing 1 s per read, and the order of clock reads and bench steps."""

    def __init__(self):
        self.now = 0.0
        self.events: list[str] = []

    def clock(self) -> float:
        self.events.append("clock")
        self.now += 1.0
        return self.now

    def wrap(self, name, fn):
        def wrapper(*args, **kwargs):
            self.events.append(name)
            return fn(*args, **kwargs)

        return wrapper


def _bench_argv(out: Path, *methods: str) -> list[str]:
    return [
        "bench",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--workloads",
        "b",
        "--queries",
        "1",
        "--methods",
        *methods,
        "--out",
        str(out),
    ]


def test_timers_enclose_only_the_forward_on_both_sides(tmp_path, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(gpu, "CLOCK", rec.clock)
    monkeypatch.setattr(gpu, "hf_prepare", rec.wrap("hf_prepare", gpu.hf_prepare))
    monkeypatch.setattr(gpu, "hf_run", rec.wrap("hf_run", gpu.hf_run))
    monkeypatch.setattr(Scorer, "plan", rec.wrap("plan", Scorer.plan))
    monkeypatch.setattr(Scorer, "run", rec.wrap("run", Scorer.run))
    out = tmp_path / "gpu.json"
    argv = _bench_argv(out, "split", "hf")
    assert gpu.main(argv) == 0
    events = rec.events
    # Each timed region (between two clock reads) is exactly one forward call, never tokenization/planning.
    regions = []
    starts = [i for i, e in enumerate(events) if e == "clock"][::2]
    for start in starts:
        end = events.index("clock", start + 1)
        regions.append(events[start + 1 : end])
    assert regions == [["hf_run"]] * gpu.REPEATS + [["run"]] * gpu.REPEATS  # hf first, then split
    first_clock = events.index("clock")
    assert events.index("hf_prepare") < first_clock  # pair tensors built before HF's timer
    split_first_clock = [i for i, e in enumerate(events) if e == "clock"][2 * gpu.REPEATS]
    assert "plan" in events[first_clock:split_first_clock]  # the plan is built before score-batch's timer
    assert "plan" not in events[split_first_clock:]
    report = json.loads(out.read_text())
    rows = report["workloads"]["b"]["methods"]
    assert list(rows) == ["hf_pairs", "split"]
    items = report["workloads"]["b"]["items"]
    for row in rows.values():
        assert row["seconds"] == 1.0 and row["items_per_s"] == items  # the fake clock's one tick per region
        assert row["attention_flops"] > 0 and row["mfu_dense"] is None  # no peak for a CPU
    assert rows["split"]["max_abs_diff_vs_hf"] <= 1e-4
    assert rows["hf_pairs"]["useful_tokens"] == rows["split"]["pairwise_tokens"]  # same pairs, counted apart
    assert report["command"] == "python bench/gpu.py " + " ".join(argv)
    assert report["device"] == report["versions"]["device"]
    assert {"torch", "transformers", "flashinfer"} <= set(report["versions"])
    assert "MFU not reported" in report["peak_source"]


def test_a_failing_method_keeps_the_report_and_fails_the_run(tmp_path, monkeypatch):
    real = Scorer.from_pretrained.__func__

    def from_pretrained(cls, model_dir, config):
        if config.backend == "sdpa":
            raise RuntimeError("out of memory (simulated)")
        return real(cls, model_dir, config)

    monkeypatch.setattr(Scorer, "from_pretrained", classmethod(from_pretrained))
    out = tmp_path / "gpu.json"
    assert gpu.main(_bench_argv(out, "hf", "sdpa", "split")) == 1
    rows = json.loads(out.read_text())["workloads"]["b"]["methods"]
    assert list(rows) == ["hf_pairs", "sdpa", "split"]
    assert rows["sdpa"]["error"] == "RuntimeError: out of memory (simulated)"
    assert rows["split"]["max_abs_diff_vs_hf"] <= 1e-4  # the methods after the failure still ran
