"""An encoder cross-encoder row for bench/gpu.py (`--methods xlmr`): an XLM-R-large-shaped classifier
(bge-reranker-v2-m3's shape: 24 layers, hidden 1,024, 16 heads, intermediate 4,096, one label) on pairs of a
30-token query and a 300-token document, score-batch (the settings auto resolves: padded pairs) against plain HF
padded pairs in the bench dtype: pairs/s, and the share of the tokens run that are padding (an unpadded path is
worth building only above 20%)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from common import INIT_STD, Shape, best_and_median, text_workload

from score_batch.engine import EngineConfig, Scorer, ScoringConfig

ENCODERS = {  # by gpu.py's --preset
    "qwen3-0.6b": dict(
        num_hidden_layers=24, hidden_size=1024, intermediate_size=4096, num_attention_heads=16
    ),
    "tiny": dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4),
}
SHAPE = Shape(32, 32, 30, 300)  # 1,024 (query, document) pairs (gpu.py --encoder-queries: the queries)
HF_BATCH = 32  # pairs per plain-HF batch, sorted by length


def build_encoder(out_dir: Path, preset: str) -> Path:
    """Tokenizer (RoBERTa pair style) + an XLM-R classifier of the preset's shape, one label, N(0, INIT_STD)."""
    from transformers import AutoModelForSequenceClassification

    from tests.tiny_models import ENCODER_PAIR_STYLES, build_tokenizer, tiny_config

    tokenizer = build_tokenizer(out_dir, pair_style=ENCODER_PAIR_STYLES["xlm-roberta"])
    config = tiny_config("xlm-roberta", "classifier", len(tokenizer), num_labels=1, max_position_embeddings=1024,
                         initializer_range=INIT_STD, **ENCODERS[preset])  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, INIT_STD)
    model.save_pretrained(out_dir, safe_serialization=True)
    return Path(out_dir)


def dense_flops_per_token(cfg: dict) -> float:
    """2 × the non-embedding weights of a BERT-style layer stack: q/k/v/o (4·h²) and the ungated MLP (2·h·I)."""
    h = cfg["hidden_size"]
    return 2.0 * cfg["num_hidden_layers"] * (4 * h * h + 2 * h * cfg["intermediate_size"])


def hf_batches(tokenizer, groups, batch: int = HF_BATCH) -> list[dict]:
    """Plain HF's pair tensors: the tokenizer's own pair call, pairs sorted by length, right-padded batches."""
    pairs = [(group.query, item) for group in groups for item in group.items]
    lengths = [len(tokenizer(q, d)["input_ids"]) for q, d in pairs]
    order = np.argsort(lengths, kind="stable")
    out = []
    for start in range(0, len(order), batch):
        chunk = [pairs[i] for i in order[start : start + batch]]
        encoded = tokenizer([q for q, _ in chunk], [d for _, d in chunk], padding=True, return_tensors="pt")
        out.append({"rows": order[start : start + batch], **encoded})
    return out


def hf_run(model, batches, count: int, device) -> np.ndarray:
    """Plain HF's logits [pairs] from prepared batches (host tensors in, host scores out)."""
    scores = np.zeros(count, np.float32)
    with torch.inference_mode():
        for batch in batches:
            inputs = {k: v.to(device) for k, v in batch.items() if k != "rows"}
            scores[batch["rows"]] = model(**inputs).logits[:, 0].float().cpu().numpy()
    return scores


def _sync(fn, *args):
    result = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result


def _row(pairs, tokens_run, real_tokens, best, median, cfg, peak) -> dict:
    dense = dense_flops_per_token(cfg) * tokens_run
    return {"items_per_s": round(pairs / best, 1), "pairs_per_s": round(pairs / best, 1),
            "median_items_per_s": round(pairs / median, 1), "seconds": round(best, 4),
            "median_seconds": round(median, 4), "tokens_run": int(tokens_run), "useful_tokens": int(real_tokens),
            "padding_tokens": int(tokens_run - real_tokens),
            "padding_share": round(1 - real_tokens / tokens_run, 4) if tokens_run else 0.0,
            "tokens_per_s": round(tokens_run / best), "dense_flops": dense,
            "mfu_dense": None if peak is None else round(dense / best / peak, 4)}  # fmt: skip


def encoder_rows(args, peak: float | None, repeats: int = 3) -> dict:
    """The `xlmr` workload: plain HF padded pairs and score-batch on the same pairs, best and median of repeats
    after a warm-up, scores compared (max |diff| of the logits)."""
    import tempfile

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg = ENCODERS[args.preset]
    dtype = getattr(torch, args.dtype)
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model_dir = build_encoder(Path(tmp), args.preset)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        shape = Shape(args.encoder_queries, SHAPE.items, SHAPE.query_tokens, SHAPE.item_tokens)
        groups = text_workload(tokenizer, shape)
        pairs = sum(len(g.items) for g in groups)
        built = round(time.perf_counter() - start, 1)
        model = (
            AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
        )
        batches = hf_batches(tokenizer, groups)
        hf_run(model, batches[:1], pairs, args.device)  # warm-up
        reference, best, median = best_and_median(repeats, _sync, hf_run, model, batches, pairs, args.device)
        padded = sum(int(b["input_ids"].numel()) for b in batches)
        real = sum(int(b["attention_mask"].sum()) for b in batches)
        rows["hf_pairs"] = {
            **_row(pairs, padded, real, best, median, cfg, peak),
            "what": "plain HF padded pairs",
        }
        del model
        scorer = Scorer.from_pretrained(
            model_dir, EngineConfig(device=args.device, dtype=args.dtype, scoring=ScoringConfig())
        )
        plan = scorer.plan(groups)
        scorer.run(plan)  # warm-up
        results, best, median = best_and_median(repeats, _sync, scorer.run, plan)
        stats = plan.stats
        row = _row(pairs, stats.packed_tokens, stats.pairwise_tokens, best, median, cfg, peak)
        ours = np.concatenate([(r.raw if r.raw is not None else r.scores)[:, 0] for r in results])  # logits
        row.update(what="score-batch, the settings auto resolves", batches=stats.batches,
                   max_abs_diff_vs_hf=float(np.abs(ours - reference).max()),
                   resolved={"backend": scorer.setup.backend, "runner": type(scorer._runner).__name__})  # fmt: skip
        rows["xlmr"] = row
        rows["xlmr"]["speedup_vs_hf"] = round(row["items_per_s"] / rows["hf_pairs"]["items_per_s"], 2)
        rows["hf_pairs"]["speedup_vs_hf"] = 1.0
    return {"shape": vars(shape), "items": pairs, "model": cfg, "build_seconds": built, "methods": rows}
