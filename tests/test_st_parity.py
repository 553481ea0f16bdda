"""sentence-transformers 6.2 CrossEncoder parity by construction (engine/model/st_model.py), against the real CrossEncoder.

Tiny local models: encoders with empty items (1 and 2 labels), a saved max_length, CausalLM rerankers that
CrossEncoder loads as Transformer + LogitScore with no arguments (plain, saved with modules.json, through a chat
template, truncated), every predict/rank argument combination on them, the constructor's arguments and
attributes, longest-first on over-long pairs (the Python API's default and the CLI's --truncate longest-first),
and an HF-cache snapshot directory picking its hub id's profile. Scores within 1e-5 (fp32).
"""

from __future__ import annotations

import json
import logging
import random
import shutil

import numpy as np
import pytest
import torch

from score_batch import Scorer
from score_batch.engine import EngineConfig, Group, ScoringConfig, ScoringInputError, SettingError
from score_batch.engine.model.source import hub_id_of
from score_batch.engine.text.truncation import longest_first_lengths
from tests.reference import max_abs_diff, reference_scores, tokenizer
from tests.test_cli import run_cli, write_jsonl
from tests.tiny_models import build_tokenizer

st = pytest.importorskip("sentence_transformers")

TOL = 1e-5
QUERY = "What is the capital of California?"
DOCS = [
    " Sacramento",
    "San Jose is a city",
    "",
    " Los Angeles",
    "the quick brown fox",
    "Tokyo is a city in Japan",
]
PAIRS = [(QUERY, d) for d in DOCS] + [
    ("Tokyo is a city", " in Japan"),
    ("red running shoes", ""),
    ("", "orphan"),
]
LONG_QUERY = "Tokyo is a city in Japan and the capital of the country " * 2
LONG_DOC = " the quick brown fox jumps over the lazy dog to get to the other side" * 3
LONG_PAIRS = [  # over 32 tokens: a long query with short and long items, a short query with a long item
    (LONG_QUERY, " Japan"),
    (LONG_QUERY, LONG_DOC),
    (LONG_QUERY, " wireless noise cancelling headphones with long battery life"),
    (LONG_QUERY, ""),
    ("red running shoes", LONG_DOC),
    ("yes", " no"),
]
# A reranker chat template carrying CrossEncoder's query/document roles: flat (content is the text) and
# structured (content is a list of typed parts), as published rerankers ship them.
FLAT_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document answers the Query. Answer yes or no.<|im_end|>\n"
    "<|im_start|>user\n"
    '<Query>: {{ messages | selectattr("role", "eq", "query") | map(attribute="content") | first }}\n'
    '<Document>: {{ messages | selectattr("role", "eq", "document") | map(attribute="content") | first }}'
    "<|im_end|>\n<|im_start|>assistant\n"
)
STRUCTURED_TEMPLATE = (
    "<|im_start|>user\n"
    '<Query>: {{ (messages | selectattr("role", "eq", "query") | first).content[0].text }}\n'
    '<Document>: {{ (messages | selectattr("role", "eq", "document") | first).content[0].text }}'
    "<|im_end|>\n<|im_start|>assistant\n"
)
USER_ONLY_TEMPLATE = (  # a chat model's template: only system/user/assistant turns are rendered
    "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}<|im_start|>assistant\n"
)


def same(ours, theirs, tol=TOL):
    """Same type, shape, dtype and values (<= tol); returns the largest difference."""
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    if isinstance(theirs, list):
        assert len(ours) == len(theirs)
        return max([same(a, b, tol) for a, b in zip(ours, theirs)], default=0.0)
    if isinstance(theirs, torch.Tensor | np.ndarray | np.generic):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape)
        a = ours.cpu().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
        b = theirs.cpu().numpy() if isinstance(theirs, torch.Tensor) else np.asarray(theirs)
        worst = max_abs_diff(a, b)
        assert worst <= tol, worst
        return worst
    assert abs(ours - theirs) <= tol
    return abs(ours - theirs)


def copy_to(source, tmp_path_factory, name="m"):
    """A copy of a model directory to edit."""
    target = tmp_path_factory.mktemp(name) / source.name
    shutil.copytree(source, target)
    return target


def with_template(source, tmp_path_factory, template):
    """A copy of a model directory whose tokenizer has a chat template (chat_template.jinja)."""
    target = copy_to(source, tmp_path_factory, "chat")
    (target / "chat_template.jinja").write_text(template)
    return target


def saved(source, tmp_path_factory, **kwargs):
    """CrossEncoder(source, **kwargs).save(dir): modules.json, config_sentence_transformers.json, its tokenizer."""
    target = tmp_path_factory.mktemp("saved") / source.name
    st.CrossEncoder(str(source), device="cpu", **kwargs).save(str(target))
    return target


def cli_scores(tmp_path, model_dir, pairs, *flags):
    """The CLI's `score` column for pairs, in input order (None for failed rows)."""
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": q, "item": d} for q, d in pairs])
    out = tmp_path / "out.jsonl"
    result = run_cli(data, "-o", out, "--overwrite", "--quiet", "--model", model_dir, *map(str, flags))
    assert result.returncode == 0, result.stderr
    return np.array([json.loads(line)["score"] for line in out.read_text().splitlines()], np.float32)


# --- item 1: encoder pairs as CrossEncoder batches them ---------------------------------------------------


@pytest.mark.parametrize("num_labels", [1, 2])
def test_empty_items_on_an_encoder_equal_cross_encoder(zoo, num_labels, tmp_path):
    model_dir = zoo.get("bert", "classifier", num_labels=num_labels)
    ours, theirs = Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu")
    tok = ours.tokenizer
    assert (
        ours.planner.plan([Group(QUERY, [""])]).tokenized[0].item_ids[0] == tok([[QUERY, ""]])["input_ids"][0]
    )
    assert tok.decode(tok([[QUERY, ""]])["input_ids"][0]).endswith("[SEP][SEP]")  # a pair, not [CLS] q [SEP]
    for kwargs in ({}, {"activation_fn": torch.nn.Identity()}, {"apply_softmax": True}):
        same(ours.predict(PAIRS, **kwargs), theirs.predict(PAIRS, **kwargs))
    logits = torch.from_numpy(theirs.predict(PAIRS, activation_fn=torch.nn.Identity()))
    # the CLI's `score`: CrossEncoder's sigmoid for one label, the last class's softmax probability for two
    expected = (torch.sigmoid(logits) if num_labels == 1 else torch.softmax(logits, -1)[:, -1]).numpy()
    got = cli_scores(tmp_path, model_dir, [p for p in PAIRS if p[0]])  # the CLI too (its empty query fails)
    assert max_abs_diff(got, expected[[i for i, p in enumerate(PAIRS) if p[0]]]) <= TOL


def test_a_saved_max_length_is_honoured(zoo, tmp_path_factory, tmp_path):
    source = zoo.get("bert", "classifier", num_labels=1)
    model_dir = saved(source, tmp_path_factory, max_length=32)
    assert json.loads((model_dir / "tokenizer_config.json").read_text())["model_max_length"] == 32
    ours, theirs = Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu")
    assert ours.max_length == theirs.max_seq_length == 32
    assert ours.setup.limits.pair_max_length == 32
    assert len(ours.tokenizer([list(LONG_PAIRS[1])])["input_ids"][0]) > 32  # over-long: truncated by both
    same(ours.predict(LONG_PAIRS + PAIRS), theirs.predict(LONG_PAIRS + PAIRS))
    # The constructor's max_length, as CrossEncoder's (never capped at the positions).
    ours16, theirs16 = (
        Scorer(source, device="cpu", max_length=16),
        st.CrossEncoder(str(source), max_length=16),
    )
    assert ours16.max_length == theirs16.max_seq_length == 16
    same(ours16.predict(LONG_PAIRS), theirs16.predict(LONG_PAIRS))
    # The CLI's default refuses the over-long pairs; --truncate longest-first equals CrossEncoder.
    data = write_jsonl(tmp_path / "long.jsonl", [{"query": q, "item": d} for q, d in LONG_PAIRS])
    refused = run_cli(data, "-o", tmp_path / "o.jsonl", "--model", model_dir, "--quiet")
    assert refused.returncode != 0 and "over the model's limit of 32" in refused.stderr + refused.stdout
    got = cli_scores(tmp_path, model_dir, LONG_PAIRS, "--truncate", "longest-first")
    assert max_abs_diff(got, theirs.predict(LONG_PAIRS)) <= TOL


# --- item 3: CausalLM rerankers: Transformer + LogitScore -------------------------------------------------


@pytest.fixture(scope="module")
def causal_dirs(zoo, tmp_path_factory):
    """CausalLM directories CrossEncoder loads as Transformer + LogitScore, by how their pairs are built."""
    plain = zoo.get("qwen3", "causal")
    llama = zoo.get("llama", "causal", add_bos=True)
    return {
        "pair-encoding": plain,
        "bos-pair-encoding": llama,
        "saved-modules": saved(plain, tmp_path_factory, max_length=32),
        "chat-flat": with_template(plain, tmp_path_factory, FLAT_TEMPLATE),
        "chat-structured": with_template(llama, tmp_path_factory, STRUCTURED_TEMPLATE),
        "chat-saved-truncated": saved(
            with_template(plain, tmp_path_factory, FLAT_TEMPLATE), tmp_path_factory, max_length=100
        ),
    }


@pytest.fixture(
    scope="module",
    params=[
        "pair-encoding",
        "bos-pair-encoding",
        "saved-modules",
        "chat-flat",
        "chat-structured",
        "chat-saved-truncated",
    ],
)
def causal(request, causal_dirs):
    """(our Scorer, CrossEncoder) of one CausalLM reranker directory, both with no arguments."""
    model_dir = causal_dirs[request.param]
    return Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu"), request.param


def test_causal_lm_scores_and_ranks_equal_cross_encoder_with_no_arguments(causal):
    ours, theirs, name = causal
    modules = [type(m).__name__ for m in theirs]
    assert modules == ["Transformer", "LogitScore"]
    assert ours.num_labels == theirs.num_labels == 1
    assert ours.max_length == theirs.max_seq_length
    assert type(ours.activation_fn) is type(theirs.activation_fn) is torch.nn.Sigmoid
    pairs = PAIRS[:-1] + LONG_PAIRS  # CrossEncoder fails an empty query + empty-ish pair: no such pair here
    worst = same(ours.predict(pairs), theirs.predict(pairs))
    got, want = ours.rank(QUERY, DOCS, return_documents=True), theirs.rank(QUERY, DOCS, return_documents=True)
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]
    assert all(abs(a["score"] - b["score"]) <= TOL and a["text"] == b["text"] for a, b in zip(got, want))
    if name == "chat-saved-truncated":  # some pairs were cut, their template tail written back
        assert ours.max_length == 100 and int(theirs.preprocess(pairs)["attention_mask"].sum(1).max()) == 100
    assert worst <= TOL


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"apply_softmax": True},
        {"activation_fn": torch.nn.Sigmoid()},
        {"activation_fn": torch.nn.Identity()},
        {"activation_fn": torch.nn.Identity(), "apply_softmax": True},
        {"convert_to_tensor": True},
        {"convert_to_numpy": False},
        {"convert_to_numpy": False, "activation_fn": torch.nn.Identity()},
        {"batch_size": 2, "show_progress_bar": False},
    ],
    ids=str,
)
def test_every_predict_argument_on_a_causal_lm_equals_cross_encoder(causal_dirs, kwargs):
    model_dir = causal_dirs["pair-encoding"]
    ours, theirs = _pair(model_dir)
    same(ours.predict(PAIRS[:-1], **kwargs), theirs.predict(PAIRS[:-1], **kwargs))
    same(ours.predict(PAIRS[1], **kwargs), theirs.predict(PAIRS[1], **kwargs))  # one pair: a scalar
    same(ours.predict([PAIRS[3]], **kwargs), theirs.predict([PAIRS[3]], **kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"top_k": 2}, {"return_documents": True}, {"activation_fn": torch.nn.Identity(), "top_k": 4}],
    ids=str,
)
def test_rank_on_a_causal_lm_equals_cross_encoder(causal_dirs, kwargs):
    ours, theirs = _pair(causal_dirs["pair-encoding"])
    got, want = ours.rank(QUERY, DOCS, **kwargs), theirs.rank(QUERY, DOCS, **kwargs)
    assert [list(r) for r in got] == [list(r) for r in want]
    assert [r["corpus_id"] for r in got] == [r["corpus_id"] for r in want]
    assert all(type(a["score"]) is float and abs(a["score"] - b["score"]) <= TOL for a, b in zip(got, want))


def test_predict_of_nothing_on_a_causal_lm_equals_cross_encoder(causal_dirs):
    ours, theirs = _pair(causal_dirs["pair-encoding"])
    same(ours.predict([]), theirs.predict([]))


_PAIRS_CACHE: dict = {}


def _pair(model_dir):
    """(Scorer, CrossEncoder) of a directory, loaded once per session."""
    if model_dir not in _PAIRS_CACHE:
        _PAIRS_CACHE[model_dir] = (
            Scorer(model_dir, device="cpu"),
            st.CrossEncoder(str(model_dir), device="cpu"),
        )
    return _PAIRS_CACHE[model_dir]


@pytest.mark.parametrize(("family", "num_labels"), [("qwen3", 1), ("qwen3", 3), ("llama", 1)])
def test_decoder_classifiers_equal_cross_encoder(zoo, tmp_path_factory, family, num_labels):
    source = zoo.get(family, "classifier", add_bos=family == "llama", num_labels=num_labels)
    model_dir = saved(source, tmp_path_factory, max_length=24)  # the long pairs are cut by both
    ours, theirs = Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu")
    pairs = PAIRS[:-1] + LONG_PAIRS
    for kwargs in ({}, {"activation_fn": torch.nn.Identity()}, {"apply_softmax": True}):
        same(ours.predict(pairs, **kwargs), theirs.predict(pairs, **kwargs))


def test_a_decoder_classifier_whose_tokenizer_ends_pairs_in_its_pad_id_equals_cross_encoder(zoo, tmp_path):
    # A reward model whose pad id is its eos, and a tokenizer appending eos to every pair: transformers reads
    # the logits before that eos; a pair with an empty document is read at the query's last token
    from tokenizers import Tokenizer, processors

    model_dir = tmp_path / "eos-pad"
    shutil.copytree(zoo.get("qwen3", "classifier", num_labels=1), model_dir)
    pad_id = json.loads((model_dir / "config.json").read_text())["pad_token_id"]
    fast = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = fast.id_to_token(pad_id)
    fast.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B:1 {eos}:1", special_tokens=[(eos, pad_id)]
    )
    fast.save(str(model_dir / "tokenizer.json"))
    ours, theirs = Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu")
    assert theirs.tokenizer("red", " shoes")["input_ids"][-1] == pad_id
    pairs = PAIRS[:-1] + [
        (QUERY, ""),
        ("red running shoes", " for women"),
        ("red running shoes", " for women"),
    ]
    same(
        ours.predict(pairs, activation_fn=torch.nn.Identity()),
        theirs.predict(pairs, activation_fn=torch.nn.Identity()),
    )


def test_a_saved_default_prompt_is_applied_as_cross_encoder_applies_it(causal_dirs, zoo, tmp_path_factory):
    sources = (
        causal_dirs["pair-encoding"],
        causal_dirs["chat-flat"],
        zoo.get("bert", "classifier", num_labels=1),
    )
    for source in sources:
        prompt = {"prompts": {"query": "Judge: "}, "default_prompt_name": "query"}
        model_dir = saved(source, tmp_path_factory, **prompt)
        ours, theirs = Scorer(model_dir, device="cpu"), st.CrossEncoder(str(model_dir), device="cpu")
        same(ours.predict(PAIRS[:-1]), theirs.predict(PAIRS[:-1]))


def test_constructor_prompts_are_applied_as_cross_encoder_applies_them(causal_dirs, zoo, tmp_path_factory):
    """Scorer(m, prompts=…, default_prompt_name=…) and predict/rank's prompt/prompt_name, as CrossEncoder 6.2."""
    sources = (
        causal_dirs["pair-encoding"],
        causal_dirs["chat-flat"],
        zoo.get("bert", "classifier", num_labels=1),
    )
    saved_prompt = {"prompts": {"query": "Judge: "}, "default_prompt_name": "query"}
    # (model, whether the prompt reaches its text: the flat template renders no system message)
    models = [(sources[0], True), (sources[1], False), (sources[2], True)]
    system = "{% for m in messages if m.role == 'system' %}<|im_start|>system\n{{ m.content }}<|im_end|>\n{% endfor %}"
    models.append((with_template(sources[0], tmp_path_factory, system + FLAT_TEMPLATE), True))
    models.append((saved(sources[0], tmp_path_factory, **saved_prompt), True))
    given = {"prompts": {"query": "Relevant? ", "other": "Other: "}, "default_prompt_name": "query"}
    pairs = PAIRS[:-1]
    for model_dir, shows in models:
        ours = Scorer(model_dir, device="cpu", **given)
        theirs = st.CrossEncoder(str(model_dir), device="cpu", **given)
        assert ours.prompts == theirs.prompts and ours.default_prompt_name == theirs.default_prompt_name
        plain = st.CrossEncoder(str(model_dir), device="cpu").predict(pairs, prompt="")
        assert (max_abs_diff(theirs.predict(pairs), plain) > 1e-3) is shows
        same(ours.predict(pairs), theirs.predict(pairs))
        for call in ({"prompt_name": "other"}, {"prompt": ""}, {"prompt": "Q: ", "prompt_name": "other"}):
            same(ours.predict(pairs, **call), theirs.predict(pairs, **call))
        same(ours.predict(pairs, prompt=""), plain)
        ranked = [theirs.rank(QUERY, DOCS, prompt_name="other"), ours.rank(QUERY, DOCS, prompt_name="other")]
        assert [[r["corpus_id"] for r in ranking] for ranking in ranked] == [
            [r["corpus_id"] for r in ranked[0]]
        ] * 2
        same([r["score"] for r in ranked[1]], [r["score"] for r in ranked[0]])
    no_default = Scorer(sources[0], device="cpu", prompts={"query": "Q: "})
    theirs = st.CrossEncoder(str(sources[0]), device="cpu", prompts={"query": "Q: "})
    same(no_default.predict(pairs), theirs.predict(pairs))
    same(no_default.predict(pairs, prompt_name="query"), theirs.predict(pairs, prompt_name="query"))
    with pytest.raises(SettingError, match="default_prompt_name='x' is not one of the prompts' names"):
        Scorer(sources[0], device="cpu", prompts={"query": "Q: "}, default_prompt_name="x")
    with pytest.raises(ScoringInputError, match="prompt_name 'x' is not one of"):
        no_default.predict(pairs, prompt_name="x")
    # A label scorer's text is the model's too: the prompt before each query, as a query template would put it
    labelled = Scorer(sources[0], device="cpu", label_tokens=("no", "yes"), **given)
    templated = Scorer(sources[0], device="cpu", label_tokens=("no", "yes"), query_template="Other: {query}")
    same(labelled.predict(pairs, prompt_name="other"), templated.predict(pairs))
    assert max_abs_diff(labelled.predict(pairs), templated.predict(pairs)) > 1e-3  # "Relevant? " by default
    given_templates = Scorer(sources[0], device="cpu", query_template="Q: {query}", **given)
    with pytest.raises(
        ScoringInputError, match="prompt 'Other: ' cannot be applied: pairs are not CrossEncoder"
    ):
        given_templates.predict(pairs, prompt_name="other")


def test_score_groups_of_a_logit_score_model_are_one_label(causal_dirs):
    ours, theirs = _pair(causal_dirs["pair-encoding"])
    result = ours.score([Group(QUERY, DOCS)])[0]
    assert result.scores.shape == (len(DOCS), 1) and ours.activation.name == "sigmoid"
    logits = theirs.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    assert max_abs_diff(result.raw[:, 0], logits) <= TOL  # query + item: the tiny tokenizer's pair encoding
    assert max_abs_diff(result.score, torch.sigmoid(torch.from_numpy(logits)).numpy()) <= TOL


def test_the_cli_scores_a_causal_lm_without_labels_by_its_logit_score_as_cross_encoder(
    causal_dirs, tmp_path_factory, tmp_path
):
    """No label flags: `score` is CrossEncoder.predict (sigmoid(logit yes - logit no)), over its chat template
    where it has one; refused, naming --label-tokens, where CrossEncoder's text cannot be scored here."""
    pairs = [pair for pair in PAIRS if pair[0]]  # the CLI's empty query is a row error
    prompted = saved(
        causal_dirs["pair-encoding"], tmp_path_factory, prompts={"q": "Judge: "}, default_prompt_name="q"
    )
    for model_dir in (
        causal_dirs["pair-encoding"],
        causal_dirs["bos-pair-encoding"],
        causal_dirs["saved-modules"],
        prompted,
    ):
        expected = st.CrossEncoder(str(model_dir), device="cpu").predict(pairs)
        assert max_abs_diff(cli_scores(tmp_path, model_dir, pairs), expected) <= TOL, model_dir
    # A reranker chat template is applied as CrossEncoder applies it (engine/model/scored_text.py); one without
    # the query/document roles, which CrossEncoder refuses too, is refused
    expected = st.CrossEncoder(str(causal_dirs["chat-flat"]), device="cpu").predict(pairs)
    assert max_abs_diff(cli_scores(tmp_path, causal_dirs["chat-flat"], pairs), expected) <= TOL
    user_only = with_template(causal_dirs["pair-encoding"], tmp_path_factory, USER_ONLY_TEMPLATE)
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": q, "item": d} for q, d in pairs])
    refused = run_cli(data, "-o", tmp_path / "o.jsonl", "--model", user_only)
    assert refused.returncode == 2
    assert "error: --label-tokens is empty" in refused.stderr and "chat template" in refused.stderr
    templated = cli_scores(tmp_path, causal_dirs["chat-flat"], pairs, "--query-template", "Q: {query}")
    assert templated.shape == (len(pairs),) and np.isfinite(templated).all()  # the text given is scored


def test_a_chat_template_without_pair_roles_is_refused_by_cross_encoder_and_scored_here(
    zoo, tmp_path_factory, caplog
):
    model_dir = with_template(zoo.get("qwen3", "causal"), tmp_path_factory, USER_ONLY_TEMPLATE)
    with pytest.raises(ValueError, match="cannot carry a 'query'/'document' pair"):
        st.CrossEncoder(str(model_dir), device="cpu").predict(PAIRS[:2])
    with caplog.at_level(logging.WARNING, logger="score_batch.engine"):
        ours = Scorer(model_dir, device="cpu")
    assert "CrossEncoder would refuse pairs for this model" in caplog.text
    plain = Scorer(zoo.get("qwen3", "causal"), device="cpu")
    assert max_abs_diff(ours.predict(PAIRS[:2]), plain.predict(PAIRS[:2])) <= TOL  # query + item instead


def test_a_causal_lm_without_yes_and_no_tokens_is_refused_as_cross_encoder_refuses_it(zoo, tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    model_dir = copy_to(zoo.get("qwen3", "causal"), tmp_path_factory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_dir / name).unlink()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(model_dir)
    assert tokenizer(str(model_dir)).convert_tokens_to_ids("yes") is None
    with pytest.raises(ValueError, match="'yes' and/or 'no'"):
        st.CrossEncoder(str(model_dir), device="cpu")
    with pytest.raises(ScoringInputError, match="needs label tokens to score"):
        Scorer(model_dir, device="cpu")
    assert Scorer(model_dir, device="cpu", label_tokens=(" fox",)).predict(PAIRS[:2]).shape == (2,)


def test_a_profiled_causal_lm_returns_cross_encoder_shapes(causal_dirs):
    """A CausalLM label scorer (labels from a profile): (n,) for every argument; activation_fn on its log-odds."""
    ours = Scorer(causal_dirs["pair-encoding"], device="cpu", label_tokens=("no", "yes"), apply_softmax=True)
    logit_score, _ = _pair(causal_dirs["pair-encoding"])
    assert ours.num_labels == 1 and ours.activation_fn is None
    default = ours.predict(PAIRS[:-1])
    assert default.shape == (len(PAIRS) - 1,)
    # P(yes) of a softmax over (no, yes) is the sigmoid of LogitScore's logit["yes"] - logit["no"]
    assert max_abs_diff(default, logit_score.predict(PAIRS[:-1])) <= TOL
    for kwargs in ({"apply_softmax": True}, {"activation_fn": torch.nn.Sigmoid()}):
        assert max_abs_diff(ours.predict(PAIRS[:-1], **kwargs), default) <= TOL
    identity = {"activation_fn": torch.nn.Identity()}
    assert (
        max_abs_diff(ours.predict(PAIRS[:-1], **identity), logit_score.predict(PAIRS[:-1], **identity)) <= TOL
    )
    assert [r["corpus_id"] for r in ours.rank(QUERY, DOCS)] == [
        r["corpus_id"] for r in logit_score.rank(QUERY, DOCS)
    ]


# --- item 4: the constructor's arguments and attributes ---------------------------------------------------


def test_cross_encoder_constructor_arguments_are_accepted(zoo, tmp_path_factory):
    model_dir = zoo.get("bert", "classifier", num_labels=1)
    ours = Scorer(
        str(model_dir),
        device="cpu",
        max_length=24,
        activation_fn=torch.nn.Identity(),
        trust_remote_code=False,
        local_files_only=True,
        revision=None,
        cache_folder=None,
        model_kwargs={"dtype": torch.float32},
        prompts={},
        default_prompt_name=None,
    )
    theirs = st.CrossEncoder(
        str(model_dir),
        device="cpu",
        max_length=24,
        activation_fn=torch.nn.Identity(),
        local_files_only=True,
        model_kwargs={"dtype": torch.float32},
    )
    assert ours.num_labels == theirs.num_labels == 1
    assert ours.max_length == theirs.max_seq_length == 24
    assert type(ours.activation_fn) is type(theirs.activation_fn) is torch.nn.Identity
    assert ours.activation.name == "none"  # the `score` column takes the given activation too
    assert ours.device == theirs.device == torch.device("cpu")
    assert type(ours.config) is type(theirs.config) and ours.config.num_labels == 1
    assert ours.tokenizer.model_max_length == theirs.tokenizer.model_max_length
    assert ours.engine_config.dtype == "float32"
    same(ours.predict(LONG_PAIRS), theirs.predict(LONG_PAIRS))
    attention = Scorer(str(zoo.get("qwen3", "causal")), device="cpu", backend="sdpa")
    assert attention.setup.backend == "sdpa"  # our attention backends are taken by name


@pytest.mark.parametrize(
    ("given", "use"),
    [
        (
            {"num_labels": 2},
            "num_labels=2 is not taken: the model's own head is scored (Scorer(..., score_index=",
        ),
        ({"config_kwargs": {"a": 1}}, "config_kwargs is not taken: the model's config.json is used as saved"),
        ({"processor_kwargs": {"a": 1}}, "processor_kwargs is not taken: use Scorer(..., max_length=…)"),
        ({"tokenizer_kwargs": {"a": 1}}, "tokenizer_kwargs is not taken: use Scorer(..., max_length=…)"),
        (
            {"token": "hf_x"},
            "token is not taken: score-batch reads a directory or the local Hugging Face cache",
        ),
        ({"modules": []}, "modules is not taken: give a model directory"),
        ({"cache_dir": "/tmp"}, "cache_dir is not taken: use Scorer(..., cache_folder=…)"),
        (
            {"automodel_args": {"a": 1}},
            "automodel_args is not taken: use Scorer(..., model_kwargs={'dtype': …})",
        ),
        (
            {"default_activation_function": torch.nn.Sigmoid()},
            "default_activation_function is not taken: use Scorer(..., activ",
        ),
        (
            {"keep_in_fp32_modules": ["a"]},
            "keep_in_fp32_modules is not taken: use Scorer(..., dtype='float32')",
        ),
        ({"model_card_data": "card"}, "model_card_data is not taken: score-batch writes no model card"),
        (
            {"model_kwargs": {"attn_implementation": "eager"}},
            "model_kwargs['attn_implementation'] is not taken",
        ),
        (
            {"model_kwargs": {"dtype": "float32", "torch_dtype": "bfloat16"}},
            "model_kwargs' dtype and torch_dtype (its older name) differ: give one",
        ),
        (
            {"backend": "onnx"},
            "CrossEncoder's backend='onnx' is not taken: score-batch runs the model in torch",
        ),
    ],
    ids=str,
)
def test_other_cross_encoder_arguments_are_refused_naming_the_setting_to_use(zoo, given, use):
    with pytest.raises(ScoringInputError) as caught:
        Scorer(str(zoo.get("bert", "classifier", num_labels=1)), device="cpu", **given)
    assert str(caught.value).startswith(use) and "\n" not in str(caught.value)


def test_cross_encoders_defaults_of_the_arguments_it_refuses_change_nothing(zoo):
    """What a wrapper forwarding CrossEncoder's whole signature passes: its defaults, backend="torch", the
    head's own num_labels and model_kwargs' older torch_dtype name are taken; scores as without them."""
    model_dir = str(zoo.get("bert", "classifier", num_labels=1))
    plain = Scorer(model_dir, device="cpu").predict(LONG_PAIRS)
    given = dict(token=None, cache_dir=None, tokenizer_kwargs={}, config_kwargs=None, model_card_data=None)
    ours = Scorer(
        model_dir,
        device="cpu",
        backend="torch",
        num_labels=1,
        model_kwargs={"torch_dtype": torch.float32},
        **given,
    )
    assert ours.engine_config.dtype == "float32"
    same(ours.predict(LONG_PAIRS), plain)


def test_engine_settings_as_keywords_keep_cross_encoders_defaults(causal_dirs):
    model_dir = causal_dirs["pair-encoding"]
    _, theirs = _pair(model_dir)
    small = Scorer(model_dir, device="cpu", max_pack_tokens=24, max_batch_tokens=64)
    assert small.engine_config.max_pack_tokens == 24 and small.scoring.truncate == "longest-first"
    scores, errors = small.predict(LONG_PAIRS, return_errors=True)
    assert np.isnan(scores[1]) and "more than a pack holds (22); raise max_pack_tokens" in errors[1]
    fits = [i for i, e in enumerate(errors) if e is None]
    assert fits and max_abs_diff(scores[fits], theirs.predict([LONG_PAIRS[i] for i in fits])) <= TOL


def test_the_attributes_of_a_causal_lm_scorer(causal_dirs):
    ours, theirs = _pair(causal_dirs["saved-modules"])
    with pytest.deprecated_call():  # CrossEncoder's deprecated max_length too
        assert ours.max_length == theirs.max_length == 32
    assert ours.config.architectures == theirs.config.architectures == ["Qwen3ForCausalLM"]
    ours.activation_fn = torch.nn.Identity()  # settable, as CrossEncoder's
    theirs.activation_fn = torch.nn.Identity()
    try:
        same(ours.predict(PAIRS[:3]), theirs.predict(PAIRS[:3]))
    finally:
        ours.activation_fn = theirs.activation_fn = torch.nn.Sigmoid()


# --- item 5: longest-first -------------------------------------------------------------------------------


@pytest.mark.parametrize("style", [None, "bert", "roberta"])
def test_longest_first_lengths_equal_the_tokenizer(style, tmp_path):
    tok = build_tokenizer(tmp_path, pair_style=style)
    words = "the quick brown fox jumps over lazy dog Tokyo Japan city capital yes no".split()
    rng = random.Random(0)
    for _ in range(300):
        query = " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        item = " ".join(rng.choice(words) for _ in range(rng.randint(0, 30)))
        first = tok(query, add_special_tokens=False)["input_ids"]
        second = tok(item, add_special_tokens=False)["input_ids"]
        added = len(tok([[query, item]])["input_ids"][0]) - len(first) - len(second)
        limit = rng.randint(added + 1, 45)
        got = tok([[query, item]], truncation="longest_first", max_length=limit)["input_ids"][0]
        keep_first, keep_second = longest_first_lengths(len(first), len(second), limit - added)
        assert len(got) == keep_first + keep_second + added
        if style is None:  # no special tokens: the kept heads of both
            assert got == first[:keep_first] + second[:keep_second]


def test_the_python_api_truncates_long_pairs_as_cross_encoder(causal_dirs, zoo):
    for model_dir in (causal_dirs["saved-modules"], zoo.get("bert", "classifier", num_labels=1)):
        ours, theirs = (
            Scorer(model_dir, device="cpu", max_length=20),
            st.CrossEncoder(str(model_dir), max_length=20),
        )
        assert ours.scoring.truncate == "longest-first"
        same(ours.predict(LONG_PAIRS), theirs.predict(LONG_PAIRS))
        strict = Scorer(model_dir, device="cpu", max_length=20, truncate="error")
        scores, errors = strict.predict(LONG_PAIRS, return_errors=True)
        assert np.isnan(scores[1]) and "over the model's limit of 20" in errors[1]
        assert "longest-first" in errors[1]


def test_the_cli_longest_first_on_a_decoder_equals_cross_encoder(zoo, tmp_path_factory, tmp_path):
    """A Qwen3 classifier saved with max_length=24: each pair cut as CrossEncoder cuts it, the long query cut
    differently for different items of its group (the shared query is cut once, each item carries the rest)."""
    model_dir = saved(zoo.get("qwen3", "classifier", num_labels=1), tmp_path_factory, max_length=24)
    theirs = st.CrossEncoder(str(model_dir), device="cpu")
    expected = theirs.predict(LONG_PAIRS)
    for packing in ("mis", "single"):
        got = cli_scores(tmp_path, model_dir, LONG_PAIRS, "--truncate", "longest-first", "--packing", packing)
        assert max_abs_diff(got, expected) <= TOL
    ours = Scorer(
        model_dir, device="cpu", config=EngineConfig(scoring=ScoringConfig(truncate="longest-first"))
    )
    assert max_abs_diff(ours.predict(LONG_PAIRS), expected) <= TOL


@pytest.mark.parametrize("item_first", [False, True])
def test_longest_first_on_a_label_scorer_equals_plain_hf_of_the_cut_pair(zoo, item_first):
    model_dir = zoo.get("llama", "causal", add_bos=True)  # "<s> A B": one special token per pair
    tok = tokenizer(str(model_dir))
    labels = (" to", " the")
    limit = 24
    cfg = ScoringConfig(label_tokens=labels, truncate="longest-first", item_first=item_first)
    group = Group(LONG_QUERY, [d for _, d in LONG_PAIRS])
    label_ids = [tok.encode(t, add_special_tokens=False)[0] for t in labels]
    scorer = Scorer(model_dir, device="cpu", config=EngineConfig(scoring=cfg), max_length=limit)
    tokenized = scorer.plan([group]).tokenized[0]
    if not item_first:  # the shared query is cut to the shortest cut; the items carry the rest
        assert 0 < len(tokenized.query_ids) < len(tok(LONG_QUERY)["input_ids"])
    results = scorer.score([group])[0]
    for index, item in enumerate(group.items):
        first, second = (item, LONG_QUERY) if item_first else (LONG_QUERY, item)
        pair = tok([[first, second]], truncation="longest_first", max_length=limit)["input_ids"][0]
        assert tokenized.reference_sequence(index) == pair
        expected, _ = reference_scores(model_dir, "causal", pair, label_ids)
        assert max_abs_diff(expected, results.scores[index]) <= 1e-4


# --- HF-cache snapshots -----------------------------------------------------------------------------------


def test_a_snapshot_directory_resolves_to_its_hub_id_for_the_profile(zoo, tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-Reranker-0.6B" / "snapshots" / ("a" * 40)
    shutil.copytree(zoo.get("qwen3", "causal"), snapshot)
    (tmp_path / "hub" / "models--Qwen--Qwen3-Reranker-0.6B" / "refs").mkdir()
    (tmp_path / "hub" / "models--Qwen--Qwen3-Reranker-0.6B" / "refs" / "main").write_text("a" * 40)
    assert hub_id_of(snapshot) == "Qwen/Qwen3-Reranker-0.6B" and hub_id_of(tmp_path) is None
    by_path = Scorer(snapshot, device="cpu")
    assert by_path.profile is not None and by_path.profile.name == "qwen3-reranker"
    by_id = Scorer("Qwen/Qwen3-Reranker-0.6B", device="cpu", cache_folder=str(tmp_path / "hub"))
    assert by_id.profile.name == "qwen3-reranker"
    assert max_abs_diff(by_path.predict(PAIRS[:3]), by_id.predict(PAIRS[:3])) <= TOL


def test_a_snapshot_directory_on_the_command_line_picks_its_hub_ids_profile(zoo, tmp_path):
    from tests.test_cli import run_cli, write_jsonl

    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-Reranker-0.6B" / "snapshots" / ("b" * 40)
    shutil.copytree(zoo.get("qwen3", "causal"), snapshot)
    src = write_jsonl(tmp_path / "in.jsonl", [{"query": "Tokyo is a city in", "item": " Japan"}])
    result = run_cli(src, "-o", tmp_path / "o.jsonl", "--model", snapshot, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "scoring profile: qwen3-reranker" in result.stderr


def test_the_demo_model_loads_in_cross_encoder_and_scores_as_scorer():
    """CrossEncoder(demo_model_path()) loads its saved Transformer + LogitScore(" yes", " no"), whose chat
    template renders score_batch.json's templates: predict and rank equal Scorer's on the sample data."""
    from pathlib import Path

    from score_batch import demo_model_path

    model_dir = demo_model_path()
    profile = json.loads((Path(model_dir) / "score_batch.json").read_text())
    theirs = st.CrossEncoder(str(model_dir), device="cpu")
    assert [type(m).__name__ for m in theirs] == ["Transformer", "LogitScore"]
    no, yes = (theirs.tokenizer.encode(t, add_special_tokens=False) for t in profile["label_tokens"])
    assert (theirs[1].false_token_id, theirs[1].true_token_id) == (no[0], yes[0])
    rendered = theirs.tokenizer.apply_chat_template(
        [{"role": "query", "content": "red shoes"}, {"role": "document", "content": "a sneaker"}],
        tokenize=False,
    )
    assert rendered == profile["query_template"].format(query="red shoes") + profile["item_template"].format(
        item="a sneaker"
    )
    rows = [
        json.loads(line) for line in (Path(__file__).parents[1] / "sample_data" / "products.jsonl").open()
    ]
    pairs = [(row["query"], row["item"]) for row in rows[:48]]
    ours = Scorer(model_dir, device="cpu")
    for kwargs in ({}, {"batch_size": 5}, {"apply_softmax": True}):
        expected = theirs.predict(pairs, **kwargs)
        got = ours.predict(pairs, **kwargs)
        assert got.shape == expected.shape and np.abs(got - expected).max() <= TOL, kwargs
    query = pairs[0][0]
    documents = [document for q, document in pairs if q == query]
    got_rank, their_rank = ours.rank(query, documents), theirs.rank(query, documents)
    assert [r["corpus_id"] for r in got_rank] == [r["corpus_id"] for r in their_rank]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(got_rank, their_rank)) <= TOL
