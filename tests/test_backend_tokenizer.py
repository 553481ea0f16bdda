"""BackendTokenizer: a run's tokenizer from tokenizer.json alone answers as transformers' tokenizer of the same
directory does; directories transformers would change on load are left to transformers."""

from __future__ import annotations

import json
import random
import shutil

import pytest
from transformers import AutoTokenizer
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from score_batch import demo_model_path
from score_batch.engine.model.loading import load_tokenizer
from score_batch.engine.text.backend_tokenizer import BackendTokenizer, backend_tokenizer
from tests.test_batch_tokenize import WORDS
from tests.tiny_models import build_tokenizer

KINDS = {
    "bpe": {},
    "bos": {"add_bos": True},
    "bert": {"pair_style": "bert"},
    "roberta": {"pair_style": "roberta"},
}


@pytest.fixture(scope="module", params=[*KINDS, "demo"])
def directory(request, tmp_path_factory):
    if request.param == "demo":
        return demo_model_path()
    out = tmp_path_factory.mktemp(request.param)
    build_tokenizer(out, **KINDS[request.param])
    return out


def test_answers_equal_transformers(directory):
    ours = load_tokenizer(directory, backend=True)
    theirs = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    assert isinstance(ours, BackendTokenizer) and type(theirs) is TokenizersBackend
    assert len(ours) == len(theirs) and ours.model_max_length == theirs.model_max_length
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id", "split_special_tokens"):
        assert getattr(ours, name) == getattr(theirs, name), name
    tokens = [*theirs.all_special_tokens, "the", "Ġthe", "not-a-token-at-all", "é"]
    assert ours.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)
    for token in tokens:
        assert ours.convert_tokens_to_ids(token) == theirs.convert_tokens_to_ids(token)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12))) for _ in range(50)]
    for special in (False, True):
        for text in texts:
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(
                text, add_special_tokens=special
            )
        batch = theirs(texts, add_special_tokens=special, return_offsets_mapping=True)
        encodings = ours.encode_batch(texts, add_special_tokens=special)
        assert [e.ids for e in encodings] == batch["input_ids"]
        assert [e.offsets for e in encodings] == [list(map(tuple, o)) for o in batch["offset_mapping"]]
    # anything else is transformers' own tokenizer, loaded on first use
    assert ours("a query", " an item")["input_ids"] == theirs("a query", " an item")["input_ids"]
    assert ours.transformers_tokenizer().get_vocab() == theirs.get_vocab()


def _edited(tmp_path, change) -> object:
    """A bpe tokenizer directory whose tokenizer_config.json `change` edits."""
    build_tokenizer(tmp_path)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    change(settings)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    return tmp_path


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(tokenizer_class="Qwen2Tokenizer"),  # a class that rebuilds its pipeline
        lambda s: s.update(add_bos_token=True),  # transformers rewrites the post-processor
        lambda s: s.update(pad_token="<never-added>"),  # transformers adds the token
        lambda s: s.update(extra_special_tokens=["<x>"]),
        lambda s: s.update(added_tokens_decoder={"0": {"content": "<other>", "special": True}}),
    ],
    ids=["own-class", "add-bos", "new-special", "extra-specials", "added-token-differs"],
)
def test_changed_on_load_is_left_to_transformers(tmp_path, change):
    path = _edited(tmp_path, change)
    assert backend_tokenizer(path, False) is None
    assert not isinstance(load_tokenizer(path, backend=True), BackendTokenizer)


def test_a_sentencepiece_or_vocab_file_beside_it_is_left_to_transformers(tmp_path):
    build_tokenizer(tmp_path)
    shutil.copy(tmp_path / "tokenizer.json", tmp_path / "vocab.json")
    assert backend_tokenizer(tmp_path, False) is None


def test_scorer_load_still_gives_transformers_tokenizer(tmp_path):
    from score_batch.engine import EngineConfig, Scorer, ScoringConfig

    scorer = Scorer.load(demo_model_path(), EngineConfig(scoring=ScoringConfig(label_tokens=(" no", " yes"))))
    assert isinstance(scorer.planner.tokenizer, BackendTokenizer)  # what the run encodes with
    assert type(scorer.tokenizer) is TokenizersBackend
