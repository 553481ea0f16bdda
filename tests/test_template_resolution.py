"""One resolution of the scored text (engine/model/scored_text.py): the command line, Scorer.predict and
sentence-transformers' CrossEncoder score the same text, within 1e-5 (fp32), on tiny classifiers and CausalLM
rerankers with and without a chat template or a saved default prompt; the run's log line names the text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from score_batch import Scorer
from score_batch.engine import ScoringConfig
from score_batch.engine.model.scored_text import resolve_text
from score_batch.engine.model.st_model import read_cross_encoder
from tests.reference import max_abs_diff, tokenizer
from tests.test_cli import run_cli, write_jsonl
from tests.test_st_parity import FLAT_TEMPLATE, STRUCTURED_TEMPLATE, saved, with_template

st = pytest.importorskip("sentence_transformers")

TOL = 1e-5
PAIRS = [
    ("What is the capital of California?", " Sacramento"),
    ("What is the capital of California?", "San Jose is a city"),
    ("What is the capital of California?", "the quick brown fox"),
    ("What is the capital of California?", ""),
    ("red running shoes", "lightweight and breathable, for women"),
    ("Tokyo is a city", " in Japan"),
    ("Tokyo is a city", "Tokyo is a city in Japan\n"),
]
CHAT_LINE = "scoring with the tokenizer's chat template"
BOS_TEMPLATE = (  # a template that renders the BOS itself, as Gemma's and Llama 3's do
    "{{ bos_token }}Query: {{ messages[0].content }}\nDocument: {{ messages[1].content }}\nRelevant:"
)


def cli_run(tmp_path, model_dir, *flags):
    """The CLI's `score` column for PAIRS (in input order) and its log."""
    data = write_jsonl(tmp_path / "in.jsonl", [{"query": q, "item": d} for q, d in PAIRS])
    out = tmp_path / "out.jsonl"
    result = run_cli(data, "-o", out, "--overwrite", "--model", model_dir, *map(str, flags))
    assert result.returncode == 0, result.stderr
    scores = [json.loads(line)["score"] for line in out.read_text().splitlines()]
    return np.array(scores, np.float32), result.stderr


@pytest.fixture(scope="module")
def models(zoo, tmp_path_factory):
    """Model directories by name: (directory, the text the run should say it scores)."""
    classifier = zoo.get("qwen3", "classifier", num_labels=1)
    causal = zoo.get("qwen3", "causal")
    bos_classifier = zoo.get("llama", "classifier", add_bos=True, num_labels=1)
    prompt = {"prompts": {"judge": "Judge: "}, "default_prompt_name": "judge"}
    return {
        "classifier": (classifier, "scoring query + item as given"),
        "classifier-chat": (with_template(classifier, tmp_path_factory, FLAT_TEMPLATE), CHAT_LINE),
        "classifier-chat-bos": (with_template(bos_classifier, tmp_path_factory, BOS_TEMPLATE), CHAT_LINE),
        "classifier-prompt": (saved(classifier, tmp_path_factory, **prompt), "the model's default prompt"),
        "encoder-prompt": (
            saved(zoo.get("bert", "classifier", num_labels=1), tmp_path_factory, **prompt),
            "the model's default prompt",
        ),
        "causal": (causal, "scoring query + item as given"),
        "causal-chat": (with_template(causal, tmp_path_factory, FLAT_TEMPLATE), CHAT_LINE),
        "causal-chat-structured": (with_template(causal, tmp_path_factory, STRUCTURED_TEMPLATE), CHAT_LINE),
    }


@pytest.mark.parametrize(
    "name",
    [
        "classifier",
        "classifier-chat",
        "classifier-chat-bos",
        "classifier-prompt",
        "encoder-prompt",
        "causal",
        "causal-chat",
        "causal-chat-structured",
    ],
)
def test_the_cli_scorer_predict_and_cross_encoder_score_the_same_text(models, name, tmp_path):
    model_dir, line = models[name]
    expected = st.CrossEncoder(str(model_dir), device="cpu").predict(PAIRS)
    api = Scorer(model_dir, device="cpu").predict(PAIRS)
    cli, log = cli_run(tmp_path, model_dir)
    assert line in log
    assert "--query-template and --item-template override" in log  # the settings spelled as the CLI's flags
    assert max_abs_diff(api, expected) <= TOL
    assert max_abs_diff(cli, api) <= TOL
    assert max_abs_diff(cli, expected) <= TOL


def test_the_chat_template_changes_the_scores_it_is_applied_to(models, tmp_path):
    """Not a template that changes nothing: with and without it the scores are far apart (the bug it fixes)."""
    plain, _ = cli_run(tmp_path, models["classifier"][0])
    chat, _ = cli_run(tmp_path, models["classifier-chat"][0])
    assert max_abs_diff(plain, chat) > 1e-2


def test_given_templates_override_the_chat_template_on_the_cli_and_in_python(models, tmp_path):
    model_dir, _ = models["classifier-chat"]
    flags = ("--query-template", "Q: {query}\n", "--item-template", "D: {item}")
    cli, log = cli_run(tmp_path, model_dir, *flags)
    assert "scoring with the templates given" in log and CHAT_LINE not in log
    api = Scorer(model_dir, device="cpu", query_template="Q: {query}\n", item_template="D: {item}")
    assert max_abs_diff(cli, api.predict(PAIRS)) <= TOL
    # the same text on the tokenizer alone: the templates wrap the query and the item, nothing else
    tok = tokenizer(str(model_dir))
    planned = api.plan([api_group("red", "shoes")]).tokenized[0]
    assert planned.query_ids == tok("Q: red\n")["input_ids"]
    assert planned.item_ids[0] == tok("D: shoes", add_special_tokens=False)["input_ids"]


def api_group(query: str, item: str):
    """One engine group of one item."""
    from score_batch.engine import Group

    return Group(query, [item])


def test_the_resolution_order(models):
    """Given templates, then item_first, then the model's chat template, then its default prompt, then none."""
    model_dir, _ = models["classifier-chat"]
    tok = tokenizer(str(model_dir))
    spec = read_cross_encoder(model_dir, tok, "Qwen3ForSequenceClassification", "qwen3")
    given = resolve_text(ScoringConfig(item_template="{item}!"), spec, tok)
    assert (given.source, given.query_template, given.item_template) == ("given", None, "{item}!")
    assert resolve_text(ScoringConfig(item_first=True), spec, tok).source == "item-first"
    chat = resolve_text(ScoringConfig(), spec, tok)
    assert chat.source == "chat" and chat.exact and chat.native
    rendered = tok.apply_chat_template(
        [{"role": "query", "content": "red"}, {"role": "document", "content": "shoes"}], tokenize=False
    )
    assert chat.query_template.replace("{query}", "red") + chat.item_template.replace("{item}", "shoes") == (
        rendered
    )
    assert resolve_text(ScoringConfig(), None, tok).source == "plain"  # nothing of the model's applies
    prompt_dir, _ = models["classifier-prompt"]
    prompt_tok = tokenizer(str(prompt_dir))
    prompt_spec = read_cross_encoder(prompt_dir, prompt_tok, "Qwen3ForSequenceClassification", "qwen3")
    prompted = resolve_text(ScoringConfig(), prompt_spec, prompt_tok)
    assert (prompted.source, prompted.query_template, prompted.exact) == ("prompt", "Judge: {query}", True)


def test_a_template_that_puts_the_document_first_is_not_split_and_says_so(zoo, tmp_path_factory, caplog):
    reversed_template = "D: {{ messages[1].content }}\nQ: {{ messages[0].content }}\nRelevant:"
    model_dir = with_template(
        zoo.get("qwen3", "classifier", num_labels=1), tmp_path_factory, reversed_template
    )
    tok = tokenizer(str(model_dir))
    spec = read_cross_encoder(model_dir, tok, "Qwen3ForSequenceClassification", "qwen3")
    text = resolve_text(ScoringConfig(), spec, tok)
    assert text.source == "plain" and text.query_template is None
    assert "chat template is not applied to packed groups" in caplog.text


def test_a_legacy_saved_max_seq_length_cuts_pairs_on_the_cli_as_in_python(zoo, tmp_path_factory, tmp_path):
    """A sibling: a CrossEncoder saved with max_seq_length in sentence_bert_config.json only (older saves):
    CrossEncoder and Scorer cut pairs there; the command line did not read it."""
    model_dir = saved(zoo.get("bert", "classifier", num_labels=1), tmp_path_factory, max_length=12)
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del tokenizer_config["model_max_length"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    module_config = json.loads((model_dir / "sentence_bert_config.json").read_text())
    (model_dir / "sentence_bert_config.json").write_text(json.dumps({**module_config, "max_seq_length": 12}))
    theirs = st.CrossEncoder(str(model_dir), device="cpu")
    assert theirs.max_length == 12
    lengths = [len(ids) for ids in tokenizer(str(model_dir))([list(p) for p in PAIRS])["input_ids"]]
    assert max(lengths) > 12  # some are cut by both
    cli, _ = cli_run(tmp_path, model_dir, "--truncate", "longest-first")
    api = Scorer(model_dir, device="cpu").predict(PAIRS)
    assert max_abs_diff(api, theirs.predict(PAIRS)) <= TOL
    assert max_abs_diff(cli, api) <= TOL


def test_an_activation_fn_crossencoder_does_not_read_is_not_applied_by_the_cli_either(zoo, tmp_path):
    """A sibling: config_sentence_transformers.json without modules.json (not a saved CrossEncoder, which 6.2
    alone reads it for): CrossEncoder and predict apply their default sigmoid; the CLI applied its Identity."""
    import shutil

    model_dir = tmp_path / "unsaved"
    shutil.copytree(zoo.get("qwen3", "classifier", num_labels=1), model_dir)
    identity = {"activation_fn": "torch.nn.modules.linear.Identity", "model_type": "CrossEncoder"}
    (model_dir / "config_sentence_transformers.json").write_text(json.dumps(identity))
    expected = st.CrossEncoder(str(model_dir), device="cpu").predict(PAIRS)
    assert ((expected > 0) & (expected < 1)).all()  # a sigmoid
    cli, log = cli_run(tmp_path, model_dir)
    assert "score activation: sigmoid" in log
    assert max_abs_diff(cli, expected) <= TOL
    assert max_abs_diff(Scorer(model_dir, device="cpu").predict(PAIRS), expected) <= TOL
