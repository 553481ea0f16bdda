"""FP8 GEMMs judged by the ranking they keep: per query Spearman ρ and top-10 overlap of the scores, FP8 (the CPU
emulation of engine/native/fp8.py: the same per-channel / per-token scales, float8 round-trip, fp32
accumulation) against bf16, with bf16 against fp32 beside it as the noise floor; the mean and the 5th percentile
over queries. Two models: the bundled demo reranker (trained weights) on sample_data/products.jsonl, and a random
Qwen3 (bench/common.BENCH_MODEL's shape, transformers' init at std 0.02) on the same text.

    python bench/fp8_agreement.py [--queries N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import rankdata

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: tests/ holds the tiny-model config

from bench.common import BENCH_MODEL  # noqa: E402
from score_batch import Scorer, demo_model_path  # noqa: E402
from score_batch.engine import Group  # noqa: E402
from score_batch.engine.native.fp8 import quantize_linears  # noqa: E402
from tests.tiny_models import tiny_config  # noqa: E402

LABELS = dict(label_tokens=(" no", " yes"), apply_softmax=True)
TOP = 10


def groups(limit: int | None) -> list[Group]:
    """sample_data's queries with their items, in file order."""
    by_query: dict[str, Group] = {}
    for line in (ROOT / "sample_data" / "products.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_query.setdefault(row["query_id"], Group(row["query"], [])).items.append(row["item"])
    return list(by_query.values())[:limit]


def random_model(out_dir: Path) -> Path:
    """A random Qwen3 with the demo model's tokenizer, weights as transformers initialises them (std 0.02)."""
    from transformers import AutoModelForCausalLM

    demo = Path(demo_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / name, out_dir / name)
    shape = {k: v for k, v in BENCH_MODEL.items() if k != "num_labels"}
    config = tiny_config(
        "qwen3", "causal", json.loads((demo / "config.json").read_text())["vocab_size"], **shape
    )
    config.initializer_range = 0.02
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out_dir)
    return out_dir


def scores(model_dir: Path, data: list[Group], dtype: str, fp8: bool = False) -> list[np.ndarray]:
    """Each query's item scores on the CPU (fp8: bf16 activations, the layers' GEMMs emulated in FP8)."""
    scorer = Scorer.from_pretrained(model_dir, device="cpu", dtype=dtype, **LABELS)
    if fp8:
        assert quantize_linears(scorer.model.backbone, emulate=True) > 0
    return [result.score.astype(np.float64) for result in scorer.score(data)]


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> dict[str, float]:
    """Per query Spearman ρ and top-10 overlap of two score lists: mean and 5th percentile."""
    rho, overlap = [], []
    for x, y in zip(a, b):
        if len(x) < 2:
            continue
        rx, ry = rankdata(x), rankdata(y)
        spread = rx.std() * ry.std()
        rho.append(1.0 if spread == 0 else float(((rx - rx.mean()) * (ry - ry.mean())).mean() / spread))
        top = min(TOP, len(x))
        overlap.append(len(set(np.argsort(-x)[:top]) & set(np.argsort(-y)[:top])) / top)
    rho, overlap = np.asarray(rho), np.asarray(overlap)
    return dict(
        rho_mean=rho.mean(),
        rho_p5=np.percentile(rho, 5),
        top_mean=overlap.mean(),
        top_p5=np.percentile(overlap, 5),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=None, help="the first N queries (default: all 300)")
    args = parser.parse_args()
    data = groups(args.queries)
    items = sum(len(g.items) for g in data)
    sizes = [len(g.items) for g in data]
    print(
        f"{len(data)} queries, {items} items (sample_data/products.jsonl, {min(sizes)}-{max(sizes)} per query:"
    )
    print(f"the top-{TOP} overlap is over min({TOP}, items) of each query); CPU; fp8 = the emulation")
    print(f"| model | pair | Spearman ρ mean | ρ p5 | top-{TOP} overlap mean | overlap p5 |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_dir in (
            ("demo (trained)", Path(demo_model_path())),
            ("random std 0.02", random_model(Path(tmp))),
        ):
            fp32, bf16, fp8 = (
                scores(model_dir, data, d, f) for d, f in (("float32", 0), ("bfloat16", 0), ("bfloat16", 1))
            )
            for pair, (a, b) in (("fp8 vs bf16", (fp8, bf16)), ("bf16 vs fp32 (noise floor)", (bf16, fp32))):
                m = agreement(a, b)
                print(
                    f"| {name} | {pair} | {m['rho_mean']:.4f} | {m['rho_p5']:.4f} | {m['top_mean']:.4f} | {m['top_p5']:.4f} |"
                )


if __name__ == "__main__":
    main()
