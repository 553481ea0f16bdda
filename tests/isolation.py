"""The sharp isolation check at the goal shape, shared by the CPU test (the reference mask) and the GPU one
(FlashInfer's kernels): a 1,500-token query with 100 items of 40 tokens in one 5,601-token pack; one item's
tokens change; every other item's score and pooled vector must stay within 1e-6. A planted leak of one key
(the first token of the next item sees the changed item's last token) must fail it."""

from __future__ import annotations

import random

import numpy as np

from score_batch.engine import EngineConfig, Group, Scorer, ScoringConfig

QUERY_TOKENS, ITEMS, ITEM_TOKENS = 1500, 100, 40
BOUND = 1e-6
CHANGED = (0, 49, 99)  # next to the query, in the middle (tiles skipped on both sides), the last item


def goal_groups(changed: int | None = None, seed: int = 0) -> list[Group]:
    """One group of random token ids (5..199) at the goal shape; `changed`: that item's tokens drawn again."""
    rng = random.Random(seed)
    query = [rng.randrange(5, 200) for _ in range(QUERY_TOKENS)]
    items = [[rng.randrange(5, 200) for _ in range(ITEM_TOKENS)] for _ in range(ITEMS)]
    if changed is not None:
        other = random.Random(seed + 1)
        items[changed] = [other.randrange(5, 200) for _ in range(ITEM_TOKENS)]
    return [Group(query, items)]


def scorer(model_dir, device: str, dtype: str, backend: str, labels=(" to", " the")) -> Scorer:
    """Scores (two-label softmax) and pooled vectors, one pack per group."""
    scoring = ScoringConfig(label_tokens=labels, apply_softmax=True, pooled_hidden_states=True)
    config = EngineConfig(device=device, dtype=dtype, backend=backend, scoring=scoring)
    return Scorer.from_pretrained(model_dir, config)


def isolation(run: Scorer, changed: int) -> dict[str, float]:
    """|difference| between the base run and the run with item `changed` drawn again: that item's own score
    (it must move) and every other item's largest score and pooled-vector difference."""
    base = run.score(goal_groups())[0]
    moved = run.score(goal_groups(changed))[0]
    others = np.arange(ITEMS) != changed
    return {
        "own": float(np.abs(base.scores[changed] - moved.scores[changed]).max()),
        "scores": float(np.abs(base.scores[others] - moved.scores[others]).max()),
        "pooled": float(np.abs(base.pooled[others] - moved.pooled[others]).max()),
    }


def leaked_key(changed: int) -> tuple[int, int]:
    """(row, key) pack positions of the planted one-key leak: the first token of item changed + 1 sees the last
    token of item `changed` (changed < ITEMS - 1). Layout: the query, then per item a delimiter and its tokens,
    then the closing delimiter."""
    assert changed + 1 < ITEMS

    def start(i: int) -> int:  # item i's first token
        return QUERY_TOKENS + i * (ITEM_TOKENS + 1) + 1

    return start(changed + 1), start(changed) + ITEM_TOKENS - 1


def leak_one_key(meta, changed: int):
    """FlashInfer's multi-item metadata of a one-pack batch with the planted leak in the kernel's own terms: the
    first token of item changed + 1 gets token_pos_in_items 3 instead of 1, so it sees the delimiter before it
    and the last token of item `changed` (engine/attention/flashinfer_plan.kernel_mask)."""
    import dataclasses

    row, key = leaked_key(changed)
    assert row - key == 2
    positions = meta.token_pos_in_items.copy()
    assert positions[row - QUERY_TOKENS] == 1  # one pack: its suffix starts at the query's end
    positions[row - QUERY_TOKENS] = 3
    return dataclasses.replace(meta, token_pos_in_items=positions)
