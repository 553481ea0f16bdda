"""Score heads: label probabilities (bounded memory, equal to the full-vocabulary formula), classifier, pooling."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from score_batch.engine.config import ScoringConfig
from score_batch.engine.run import heads
from score_batch.engine.run.heads import classifier_scores, label_scores, pooled_vectors, soft_cap

RTOL = 1e-5  # float32: a label-row matmul differs from the full one by ~1e-6 on logits of ~5
IDENTITY = torch.eye(4)  # the head passes the hidden state through as logits


def full_reference(rows, weight, bias, label_ids, apply_softmax, softcap):
    """The plain formula: whole [n, vocab] logits, then log-softmax (or a softmax over the label columns)."""
    logits = soft_cap(F.linear(rows, weight, bias), softcap).float()
    if apply_softmax:
        return torch.softmax(logits[:, label_ids], dim=-1)
    return torch.log_softmax(logits, dim=-1)[:, label_ids].exp()


def test_label_scores_use_full_vocabulary():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    scores = label_scores(logits, IDENTITY, None, torch.tensor([1, 3]), apply_softmax=False, softcap=None)
    total = sum(math.exp(v) for v in (0, 1, 2, 3))
    assert torch.allclose(scores, torch.tensor([[math.exp(1) / total, math.exp(3) / total]]))
    assert scores.sum() < 1


def test_label_softmax_over_labels_only_sums_to_one():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    scores = label_scores(logits, IDENTITY, None, torch.tensor([1, 3]), apply_softmax=True, softcap=None)
    assert torch.allclose(scores, torch.softmax(torch.tensor([[1.0, 3.0]]), -1))


@pytest.mark.parametrize("apply_softmax", [False, True])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_and_label_only_heads_equal_the_full_computation(apply_softmax, softcap, with_bias):
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(1000, 32, generator=generator)
    weight = torch.randn(5003, 32, generator=generator) / 4
    bias = torch.randn(5003, generator=generator) if with_bias else None
    label_ids = torch.tensor([7, 5002, 0, 1234])
    budget = 37 * 5003 * 8  # 37 rows per chunk: many chunks, the last one short
    scores = label_scores(rows, weight, bias, label_ids, apply_softmax, softcap, budget_bytes=budget)
    expected = full_reference(rows, weight, bias, label_ids, apply_softmax, softcap)
    assert scores.dtype == torch.float32 and scores.shape == (1000, 4)
    assert torch.allclose(scores, expected, rtol=RTOL, atol=0)


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_head_memory_stays_bounded_for_30k_score_rows(monkeypatch, apply_softmax):
    generator = torch.Generator().manual_seed(1)
    rows = torch.randn(30_000, 16, generator=generator)  # e.g. one-token items filling a 65k-token batch
    weight = torch.randn(8192, 16, generator=generator)
    label_ids = torch.tensor([3, 4000])
    largest = []
    original = heads.head_logits

    def recording(*args):
        logits = original(*args)
        largest.append(logits.numel())
        return logits

    monkeypatch.setattr(heads, "head_logits", recording)
    scores = label_scores(rows, weight, None, label_ids, apply_softmax, None)
    full_bytes = rows.shape[0] * weight.shape[0] * 4  # what [rows, vocab] float32 logits would take: 983 MB
    assert max(largest) * (4 + 4) <= heads.HEAD_BUDGET_BYTES < full_bytes / 10
    if apply_softmax:
        assert max(largest) == rows.shape[0] * len(label_ids)  # the label rows of the head only
    sample = torch.tensor([0, 1, 2047, 2048, 12_345, 29_999])  # rows on both sides of chunk borders
    expected = full_reference(rows[sample], weight, None, label_ids, apply_softmax, None)
    assert torch.allclose(scores[sample], expected, rtol=RTOL, atol=0)


def test_classifier_scores_raw_or_softmaxed():
    logits = torch.tensor([[1.0, -1.0]], dtype=torch.bfloat16)
    assert classifier_scores(logits, False).dtype == torch.float32
    assert torch.allclose(classifier_scores(logits, True).sum(-1), torch.tensor([1.0]))


def test_pooled_vectors_normalize():
    hidden = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(pooled_vectors(hidden, False), hidden)
    assert torch.allclose(pooled_vectors(hidden, True), torch.tensor([[0.6, 0.8]]))


def test_soft_cap():
    logits = torch.tensor([100.0])
    assert soft_cap(logits, None) is logits
    assert soft_cap(logits, 30.0).item() < 30.0


# --- score_and_pool: score rows → (raw, scores, pooled), both runners' one step ----------------------------


def _rows_and_head(dtype=torch.float32, vocab=50, hidden=8, bias=True):
    """Hand-made score rows [3, hidden] and a linear head [vocab, hidden] (seeded)."""
    generator = torch.Generator().manual_seed(7)
    rows = torch.randn(3, hidden, generator=generator).to(dtype)
    head = torch.nn.Linear(hidden, vocab, bias=bias).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=generator))
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=generator))
    return rows, head


def _by_hand(rows, head, softcap=None):
    """Full [n, vocab] logits written out: rows · Wᵀ + b, soft-capped, as float32."""
    logits = rows.double() @ head.weight.double().T + (0 if head.bias is None else head.bias.double())
    return (logits if softcap is None else softcap * torch.tanh(logits / softcap)).float()


@pytest.mark.parametrize("softcap", [None, 4.0])
def test_score_and_pool_causal_label_probabilities_over_the_vocabulary(softcap):
    rows, head = _rows_and_head()
    ids = torch.tensor([3, 11, 42])
    cfg = ScoringConfig()
    raw, scores, pooled = heads.score_and_pool(rows, cfg, head, ids, softcap)
    logits = _by_hand(rows, head, softcap)
    expected = logits[:, ids].exp() / logits.exp().sum(dim=-1, keepdim=True)
    assert torch.allclose(scores, expected, rtol=1e-5, atol=1e-7) and raw is scores and pooled is None
    soft = heads.score_and_pool(rows, replace(cfg, apply_softmax=True), head, ids, softcap)[1]
    assert torch.allclose(soft, torch.softmax(logits[:, ids], dim=-1), rtol=1e-5)


@pytest.mark.parametrize("label_score", ["logit", "sigmoid"])
def test_score_and_pool_causal_label_logits_and_sigmoids(label_score):
    rows, head = _rows_and_head()
    ids = torch.tensor([5, 1])
    raw, scores, _ = heads.score_and_pool(rows, ScoringConfig(label_score=label_score), head, ids, 2.0)
    logits = _by_hand(rows, head, 2.0)[:, ids]
    expected = logits if label_score == "logit" else 1 / (1 + torch.exp(-logits))
    assert scores.dtype == torch.float32 and torch.allclose(scores, expected, rtol=1e-5) and raw is scores


@pytest.mark.parametrize("apply_softmax", [False, True])
def test_score_and_pool_classifier_logits_from_its_head_or_its_forward(apply_softmax):
    rows, head = _rows_and_head(torch.bfloat16, vocab=3)
    cfg = ScoringConfig(apply_softmax=apply_softmax)
    raw, scores, pooled = heads.score_and_pool(rows, cfg, head)
    logits = F.linear(rows, head.weight, head.bias).float()  # the head in the model's dtype, then float32
    assert raw.dtype == torch.float32 and torch.equal(raw, logits) and pooled is None
    expected = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True) if apply_softmax else logits
    assert torch.allclose(scores, expected, rtol=1e-6)
    given = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=torch.bfloat16)  # an encoder's own forward
    raw, scores, pooled = heads.score_and_pool(None, cfg, logits=given)
    assert torch.equal(raw, given.float()) and pooled is None
    assert torch.allclose(scores, torch.softmax(given.float(), -1) if apply_softmax else given.float())


@pytest.mark.parametrize("normalize", [False, True])
def test_score_and_pool_pooled_vectors(normalize):
    rows, head = _rows_and_head(torch.bfloat16, vocab=2)
    cfg = ScoringConfig(pooled_hidden_states=True, normalize=normalize)
    pooled = heads.score_and_pool(rows, cfg, head)[2]
    plain = rows.float()
    expected = plain / plain.pow(2).sum(-1, keepdim=True).sqrt() if normalize else plain
    assert pooled.dtype == torch.float32 and pooled.shape == (3, 8)
    assert torch.allclose(pooled, expected, rtol=1e-6)
    if normalize:
        assert torch.allclose(pooled.norm(dim=-1), torch.ones(3), rtol=1e-6)
