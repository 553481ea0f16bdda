"""The window's texts encoded in two batch calls of the tokenizers backend give exactly the token ids (and
content tokens) that transformers' own __call__ gives, under every truncation policy, template and layout."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from score_batch import demo_model_path
from score_batch.engine.config import ScoringConfig
from score_batch.engine.model.loading import load_tokenizer
from score_batch.engine.plan.planner import PackedPlanner, PlanLimits
from score_batch.engine.text import encode, truncation
from score_batch.engine.types import Group
from tests.tiny_models import BASE_CORPUS, build_tokenizer

WORDS = sorted({w for line in BASE_CORPUS for w in line.split()}) + ["é", "日本", "<|im_end|>", "  ", "\n"]
TEMPLATES = [
    (None, None),
    ("Query: {query}\n", "Product: {item}"),
    ("<|im_start|>{query}", "{item} <|im_end|>"),
]
POLICIES = [
    dict(truncate="error"),
    dict(truncate="item-tail", max_item_tokens=6),
    dict(truncate="query-head", max_query_tokens=9),
    dict(truncate="longest-first", max_item_tokens=12),
    dict(truncate="chunk", max_item_tokens=7, chunk_overlap=2),
    dict(truncate="chunk", max_item_tokens=5),
]


@pytest.fixture(scope="module", params=["bpe", "bos", "bert"])
def tokenizer(request, tmp_path_factory):
    """transformers' tokenizer: its backend's batch calls are checked against its own __call__."""
    kind = request.param
    out = tmp_path_factory.mktemp(request.param)
    if kind == "bert":
        build_tokenizer(out, pair_style="bert")
    else:
        build_tokenizer(out, add_bos=kind == "bos")
    return AutoTokenizer.from_pretrained(out)


def random_groups(seed: int) -> list[Group]:
    rng = random.Random(seed)

    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))

    queries = [text(1, 14) for _ in range(4)] + [""]
    groups = []
    for _ in range(6):
        items = [text(0, 16) for _ in range(rng.randint(1, 5))]
        groups.append(Group(rng.choice(queries), items))  # repeated queries: encoded once per call
    return groups


def plan_fields(plan):
    return [(g.query_ids, g.item_ids, g.errors, g.chunks, g.item_first) for g in plan.tokenized], [
        (g.query_ids, g.item_ids) for g in plan.scored
    ]


LAYOUTS = [  # chunking needs the query first
    pytest.param(
        policy, item_first, id="-".join(map(str, policy.values())) + ("-item-first" if item_first else "")
    )
    for policy in POLICIES
    for item_first in (False, True)
    if not (item_first and policy["truncate"] == "chunk")
]


@pytest.mark.parametrize("policy, item_first", LAYOUTS)
@pytest.mark.parametrize("templates", TEMPLATES, ids=["plain", "templated", "special"])
def test_backend_batch_equals_transformers_call(tokenizer, policy, templates, item_first, monkeypatch):
    cfg = ScoringConfig(
        query_template=templates[0], item_template=templates[1], item_first=item_first, **policy
    )
    limits = PlanLimits(
        max_pack_tokens=40,
        max_batch_tokens=80,
        delimiter_token_id=0,
        vocab_size=len(tokenizer),
        max_positions=64,
    )
    planner = PackedPlanner(tokenizer, cfg, limits)
    for seed in range(4):
        groups = random_groups(seed)
        whole = planner.plan(groups)
        fast = plan_fields(whole)
        # a pipeline's tokenize stage, then its pack stage
        split = planner.plan(groups, planner.encode(groups))
        assert plan_fields(split) == fast and split.stats == whole.stats
        assert whole.encoded is None and split.encoded is not None  # only a pipeline's plan holds encodings
        with monkeypatch.context() as patch:  # today's path: transformers' __call__ with offsets, per group
            patch.setattr(encode, "backend_encode", lambda *args: None)
            slow = plan_fields(PackedPlanner(tokenizer, cfg, limits).plan(groups))
            per_group = [plan_fields(PackedPlanner(tokenizer, cfg, limits).plan([g])) for g in groups]
        assert fast == slow
        assert fast[0] == [fields for one in per_group for fields in one[0]]


def test_the_tokenizers_a_run_loads_take_the_backends_batch_call(tokenizer):
    """The comparison above holds only where backend_encode runs: the test tokenizers and the demo model's,
    as load_tokenizer gives them, are encoded by the Rust backend's encode_batch (not their __call__)."""
    texts = ["Tokyo is a city", "é 日本 <|im_end|>"]
    for loaded in (tokenizer, load_tokenizer(demo_model_path())):
        encodings = encode.backend_encode(loaded, texts, True)
        assert encodings is not None, type(loaded)
        assert [e.ids for e in encodings] == loaded(texts)["input_ids"]


def test_content_tokens_agree_with_transformers_offsets(tokenizer):
    texts = [" ".join(random.Random(k).choice(WORDS) for _ in range(9)) for k in range(20)]
    encoded = encode.encode_texts(tokenizer, "Product: {item}!", "{item}", texts, True)
    batch = tokenizer(["Product: " + t + "!" for t in texts], return_offsets_mapping=True)
    start = len("Product: ")
    for text, enc, ids, offsets in zip(texts, encoded, batch["input_ids"], batch["offset_mapping"]):
        assert enc.ids == ids
        end = start + len(text)
        assert enc.content == [i for i, (s, e) in enumerate(offsets) if e > s and s >= start and e <= end]


def test_token_ids_are_checked_as_before():
    assert truncation.check_ids([1, 2, 3], 4, "q") is None
    assert "token id 4 " in truncation.check_ids([1, 4], 4, "q")
    assert "token id -1 " in truncation.check_ids([-1, 2], 4, "q")
    assert "token id 2.0 " in truncation.check_ids([1, 2.0], 4, "q")  # a float is not a token id
    assert "token id 'a' " in truncation.check_ids([1, "a"], 4, "q")
    assert truncation.check_ids([True, 2], 4, "q") is None  # as the per-token check always took bools
