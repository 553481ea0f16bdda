"""Score heads: label probabilities (bounded memory, equal to the full-vocabulary formula), classifier, pooling."""

import math

import pytest
import torch
import torch.nn.functional as F

from score_batch.engine import heads
from score_batch.engine.heads import classifier_scores, label_scores, pooled_vectors, soft_cap

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
