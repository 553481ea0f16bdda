"""Score heads on hand-made logits: label probabilities, softmax, classifier and pooling."""

import math

import torch

from engine.heads import classifier_scores, label_probabilities, pooled_vectors, soft_cap


def test_label_probabilities_use_full_vocabulary():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    scores = label_probabilities(logits, torch.tensor([1, 3]), apply_softmax=False)
    total = sum(math.exp(v) for v in (0, 1, 2, 3))
    assert torch.allclose(scores, torch.tensor([[math.exp(1) / total, math.exp(3) / total]]))
    assert scores.sum() < 1


def test_label_softmax_over_labels_only_sums_to_one():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    scores = label_probabilities(logits, torch.tensor([1, 3]), apply_softmax=True)
    assert torch.allclose(scores, torch.softmax(torch.tensor([[1.0, 3.0]]), -1))


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
