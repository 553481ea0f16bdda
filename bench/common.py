"""Shared pieces of the benchmarks: the bench model, text workloads and the plain-HF baseline loop."""

from __future__ import annotations

import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from score_batch.engine import Group

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: tests/ holds the tiny-model fixtures
from tests.tiny_models import BASE_CORPUS, build_tokenizer, tiny_config  # noqa: E402

# A small but real Qwen3: 4 layers, hidden 256, GQA 8/4 heads of 32 (about 1.6M non-embedding weights).
BENCH_MODEL = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    num_labels=2,
)
LABELS = (" no", " yes")
# The bench's random weights are drawn as transformers initialises a model (N(0, initializer_range = 0.02)), the
# scale of trained weights: under the N(0, 0.15) of the test models plain HF in bf16 differs from fp32 by 0.13 on
# the 0.6B shape, and a kernel error of 0.05 would hide in that noise.
INIT_STD = 0.02


def build_bench_model(
    out_dir: Path, kind: str, vocab_size: int | None = None, family: str = "qwen3", seed: int = 0, **overrides
) -> Path:
    """Tokenizer + random model of a family (a Qwen3 by default) and kind ('causal' or 'classifier') in out_dir
    (BENCH_MODEL unless overridden), its matrices drawn from N(0, INIT_STD) as transformers initialises them."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    tokenizer = build_tokenizer(out_dir)
    settings = {
        k: v for k, v in {**BENCH_MODEL, **overrides}.items() if kind == "classifier" or k != "num_labels"
    }
    config = tiny_config(family, kind, vocab_size or len(tokenizer), initializer_range=INIT_STD, **settings)
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
    model = auto.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:  # linear and embedding matrices; norms stay 1 and biases 0, as initialised
                param.normal_(0.0, INIT_STD)
    model.save_pretrained(out_dir, safe_serialization=True)
    return Path(out_dir)


@dataclass(frozen=True)
class Shape:
    """A workload shape: queries, items per query and lengths in tokens (approximate, ±15%)."""

    queries: int
    items: int
    query_tokens: int
    item_tokens: int


def text_workload(tokenizer, shape: Shape, seed: int = 0) -> list[Group]:
    """Text groups of about the shape's token lengths, from the tokenizer's own corpus words."""
    rng = random.Random(seed)
    words = sorted({w for line in BASE_CORPUS for w in line.split()})
    cost = {w: len(tokenizer.encode(" " + w, add_special_tokens=False)) for w in words}

    def text(target: int) -> str:
        target = max(1, round(target * rng.uniform(0.85, 1.15)))
        out, used = [], 0
        while used < target:
            word = rng.choice(words)
            out.append(word)
            used += cost[word]
        return " " + " ".join(out)

    return [
        Group(text(shape.query_tokens).strip(), [text(shape.item_tokens) for _ in range(shape.items)])
        for _ in range(shape.queries)
    ]


@dataclass(frozen=True)
class HfBatch:
    """One right-padded batch of (query + item) pairs, built on the host before any timer starts."""

    ids: torch.Tensor  # [rows, width] int64 token ids, zero-padded
    mask: torch.Tensor  # [rows, width] int64 attention mask
    refs: tuple[tuple[int, int], ...]  # (group, item) of each row
    lengths: tuple[int, ...]  # real tokens of each row


def hf_prepare(tokenizer, groups: list[Group], batch_size: int = 32) -> list[HfBatch]:
    """What a careful user builds: (query + item) pairs sorted by length, right-padded batches (host tensors)."""
    pairs = []
    for g, group in enumerate(groups):
        query = tokenizer(group.query)["input_ids"]
        for i, item in enumerate(group.items):
            pairs.append((g, i, query + tokenizer(item, add_special_tokens=False)["input_ids"]))
    pairs.sort(key=lambda p: len(p[2]))
    batches = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        width = max(len(p[2]) for p in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (_, _, seq) in enumerate(chunk):
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        batches.append(
            HfBatch(ids, mask, tuple((g, i) for g, i, _ in chunk), tuple(len(p[2]) for p in chunk))
        )
    return batches


def hf_run(
    model, batches: list[HfBatch], groups: list[Group], kind: str, label_ids, label_softmax: bool = False
):
    """The plain-HF forward of prepared batches: host tensors in, host scores out (the head at the last real token).

    Causal scores are the label tokens' probabilities over the whole vocabulary, or with label_softmax the
    softmax over the label tokens' logits alone (ScoringConfig.apply_softmax).
    Returns (scores per group [items, num_scores], tokens run including padding).
    """
    num_scores = len(label_ids) if kind == "causal" else model.config.num_labels
    out = [np.zeros((len(g.items), num_scores), np.float32) for g in groups]
    tokens = 0
    backbone = model.model
    head = model.lm_head if kind == "causal" else model.score
    device = model.device
    with torch.inference_mode():
        for batch in batches:
            tokens += batch.ids.numel()
            ids, mask = batch.ids.to(device), batch.mask.to(device)
            hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state  # [rows, width, hidden]
            last = hidden[torch.arange(len(batch.refs), device=device), mask.sum(1) - 1]  # [rows, hidden]
            logits = head(last).float()
            if kind != "causal":
                scores = logits
            elif label_softmax:
                scores = torch.softmax(logits[:, list(label_ids)], -1)
            else:
                scores = torch.log_softmax(logits, -1)[:, list(label_ids)].exp()
            scores = scores.cpu().numpy()  # [rows, num_scores]
            for row, (g, i) in enumerate(batch.refs):
                out[g][i] = scores[row]
    return out, tokens


def hf_pairs(model, tokenizer, groups: list[Group], kind: str, label_ids, batch_size: int = 32):
    """hf_prepare then hf_run: the plain-HF baseline end to end from text.

    Returns (scores per group [items, num_scores], tokens run including padding).
    """
    return hf_run(model, hf_prepare(tokenizer, groups, batch_size), groups, kind, label_ids)


def timed(fn, *args, clock=time.perf_counter, **kwargs):
    """(result, seconds) of one call, read on clock."""
    start = clock()
    result = fn(*args, **kwargs)
    return result, clock() - start


def best_of(repeats: int, fn, *args, clock=time.perf_counter, **kwargs):
    """(result of the first call, fastest seconds) over repeats calls of fn(*args, **kwargs)."""
    result, best, _ = best_and_median(repeats, fn, *args, clock=clock, **kwargs)
    return result, best


def best_and_median(repeats: int, fn, *args, clock=time.perf_counter, **kwargs):
    """(result of the first call, fastest seconds, median seconds) over repeats calls of fn(*args, **kwargs)."""
    runs = [timed(fn, *args, clock=clock, **kwargs) for _ in range(repeats)]
    seconds = [s for _, s in runs]
    return runs[0][0], min(seconds), median(seconds)


def median(values) -> float:
    """The middle value (the mean of the two middle ones for an even count)."""
    import statistics

    return statistics.median(values)


def machine() -> str:
    """One line naming the machine and software the figures come from."""
    import transformers

    from score_batch.machine import device_name

    cpu = device_name("cpu")

    return (
        f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}"
    )


def max_abs_diff(results, reference) -> float:
    """Largest |score-batch − reference| over all items of all groups."""
    return max(
        (float(np.abs(r.scores - ref).max()) for r, ref in zip(results, reference) if ref.size), default=0.0
    )
