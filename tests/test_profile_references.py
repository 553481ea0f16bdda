"""Each built-in scoring profile against a transcription of the scoring code its model card (or its library) gives.

The models are tiny random ones of the real architecture (tests/tiny_models.py) with the special tokens and
prompt tokens the reference code uses; the references are transcribed below with their sources named, and the
profiles run through the engine (MIS packing: several items of a query share one sequence).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from score_batch.engine import Group, Scorer
from score_batch.engine.config import ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.model.profiles import builtin_profiles
from score_batch.engine.run.heads import label_scores
from tests.tiny_models import BASE_CORPUS, build_model, build_tokenizer

QUERIES = ["what is the capital of Japan?", "red running shoes", "wireless headphones"]
ITEMS = [
    "Tokyo is a city in Japan and the capital of the country",
    "red running shoes for women, lightweight and breathable",
    "the quick brown fox jumps over the lazy dog",
    "wireless noise cancelling headphones with long battery life",
    "Sacramento San Jose San Francisco Los Angeles",
]

# FlagEmbedding's default prompt for its LLM rerankers (FlagEmbedding/inference/reranker/decoder_only/base.py).
FLAG_PROMPT = (
    "Given a query A and a passage B, determine whether the passage contains an answer to the query by "
    "providing a prediction of either 'Yes' or 'No'."
)
# The Qwen3-Reranker model card's prompt pieces (huggingface.co/Qwen/Qwen3-Reranker-0.6B, "Transformers Usage").
QWEN3_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"


# --------------------------------------------------------------------------------------------- tiny models


def gemma_tokenizer(out_dir: Path):
    """A tiny tokenizer shaped like Gemma's: <pad>=0, <eos>=1, <bos>=2, <unk>=3, <bos> added in front of every
    encoding, spaces normalized to '▁' and no pre-tokenizer (BPE merges may cross words, as in SentencePiece),
    "\\n" a token of its own (an added token), and 'Yes' one token."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [*(q + "\n" + i for q, i in itertools.product(QUERIES, ITEMS)), FLAG_PROMPT] * 10
    corpus += BASE_CORPUS * 10 + ["Yes", "No", "Yes No"] * 30
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Replace("▁", " ")
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"], max_token_length=8
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens(["\n"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", 2)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",  # Gemma's tokenizer pads on the left
    )
    fast.save_pretrained(out_dir)
    return fast


@pytest.fixture(scope="module")
def gemma_reranker(tmp_path_factory) -> Path:
    """A tiny GemmaForCausalLM (tied embeddings, as bge-reranker-v2-gemma) named like the hub model."""
    out = tmp_path_factory.mktemp("gemma") / "bge-reranker-v2-gemma"
    tokenizer = gemma_tokenizer(out)
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert len(tokenizer("Yes", add_special_tokens=False)["input_ids"]) == 1
    build_model(
        out, "gemma", "causal", vocab_size=len(tokenizer), tie_word_embeddings=True,
        pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def qwen3_reranker(tmp_path_factory) -> Path:
    """A tiny Qwen3ForCausalLM with Qwen3-Reranker's chat tokens, <think>/</think> and single-token yes/no."""
    out = tmp_path_factory.mktemp("qwen3") / "Qwen3-Reranker-0.6B"
    corpus = [QWEN3_PREFIX + f"<Instruct>: {QWEN3_TASK}\n<Query>: q\n<Document>: d" + QWEN3_SUFFIX] * 20
    tokenizer = build_tokenizer(out, corpus=corpus + QUERIES * 10 + ITEMS * 10)
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save_pretrained(out)
    for token in ("yes", "no"):
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1
    build_model(out, "qwen3", "causal", vocab_size=len(tokenizer))
    return out


def engine_scores(model_dir: Path, **kwargs) -> np.ndarray:
    """[queries, items] scores of the engine, every query's items packed into one sequence."""
    scorer = Scorer(model_dir, device="cpu", **kwargs)
    results = scorer.score([Group(query, ITEMS) for query in QUERIES])
    return np.stack([np.asarray(result.score, dtype=np.float64) for result in results])


def pairs() -> list[tuple[str, str]]:
    return [(query, item) for query in QUERIES for item in ITEMS]


# ------------------------------------------------------------------------ FlagEmbedding (bge-reranker-v2-gemma)


def prepare_for_model(ids, pair_ids, truncation, max_length, **ignored) -> dict:
    """transformers 4's PreTrainedTokenizerBase.prepare_for_model for the arguments FlagEmbedding passes
    (add_special_tokens=False, padding=False, no attention mask or token types), which transformers 5's fast
    tokenizers no longer have: truncation="only_second" removes the overflow from the end of pair_ids (the
    default truncation_side "right"), then the two are concatenated."""
    assert truncation == "only_second" and ignored["add_special_tokens"] is False
    overflow = len(ids) + len(pair_ids) - max_length
    if overflow > 0:
        pair_ids = pair_ids[:-overflow]
    return {"input_ids": list(ids) + list(pair_ids)}


def flag_llm_reranker_compute_score(
    model_dir: Path, sentence_pairs, max_length: int = 512, normalize: bool = False, batch_size: int = 4
):
    """FlagEmbedding's FlagLLMReranker.compute_score, transcribed from FlagEmbedding v1.3
    (FlagEmbedding/inference/reranker/decoder_only/base.py: BaseLLMReranker.compute_score_single_gpu, with
    AbsReranker.get_detailed_inputs adding its default query_instruction_for_rerank "A: " and
    passage_instruction_for_rerank "B: " in the format "{}{}", Collater and last_logit_pool), single device,
    fp32, no dataloader; tokenizer.prepare_for_model is prepare_for_model above. The reference for the
    bge-reranker-v2-gemma profile."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yes_loc = tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
    # get_detailed_inputs: "{}{}".format("A: ", query), "{}{}".format("B: ", passage)
    sentence_pairs = [["{}{}".format("A: ", q), "{}{}".format("B: ", p)] for q, p in sentence_pairs]
    query_max_length = max_length * 3 // 4
    all_queries_inputs, all_passages_inputs = [], []
    for start_index in range(0, len(sentence_pairs), batch_size):
        sentences_batch = sentence_pairs[start_index : start_index + batch_size]
        queries = [s[0] for s in sentences_batch]
        passages = [s[1] for s in sentences_batch]
        queries_inputs_batch = tokenizer(
            queries,
            return_tensors=None,
            add_special_tokens=False,
            max_length=query_max_length,
            truncation=True,
        )
        passages_inputs_batch = tokenizer(
            passages, return_tensors=None, add_special_tokens=False, max_length=max_length, truncation=True
        )
        all_queries_inputs.extend(
            {k: queries_inputs_batch[k][i] for k in queries_inputs_batch.keys()}
            for i in range(len(sentences_batch))
        )
        all_passages_inputs.extend(
            {k: passages_inputs_batch[k][i] for k in passages_inputs_batch.keys()}
            for i in range(len(sentences_batch))
        )
    length_sorted_idx = np.argsort(
        [
            -len(x["input_ids"]) - len(y["input_ids"])
            for (x, y) in zip(all_queries_inputs, all_passages_inputs)
        ]
    )
    all_queries_inputs_sorted = [all_queries_inputs[i] for i in length_sorted_idx]
    all_passages_inputs_sorted = [all_passages_inputs[i] for i in length_sorted_idx]
    prompt = FLAG_PROMPT
    prompt_inputs = tokenizer(prompt, return_tensors=None, add_special_tokens=False)["input_ids"]
    sep = "\n"
    sep_inputs = tokenizer(sep, return_tensors=None, add_special_tokens=False)["input_ids"]
    encode_max_length = max_length + len(sep_inputs) + len(prompt_inputs)
    all_scores = []
    with torch.no_grad():
        for batch_start in range(0, len(all_queries_inputs_sorted), batch_size):
            queries_inputs = all_queries_inputs_sorted[batch_start : batch_start + batch_size]
            passages_inputs = all_passages_inputs_sorted[batch_start : batch_start + batch_size]
            batch_inputs = []
            for query_inputs, passage_inputs in zip(queries_inputs, passages_inputs):
                if tokenizer.bos_token_id is not None and tokenizer.bos_token_id != tokenizer.pad_token_id:
                    item = prepare_for_model(
                        [tokenizer.bos_token_id] + query_inputs["input_ids"],
                        sep_inputs + passage_inputs["input_ids"],
                        truncation="only_second",
                        max_length=encode_max_length,
                        padding=False,
                        return_attention_mask=False,
                        return_token_type_ids=False,
                        add_special_tokens=False,
                    )
                else:
                    item = prepare_for_model(
                        query_inputs["input_ids"],
                        sep_inputs + passage_inputs["input_ids"],
                        truncation="only_second",
                        max_length=encode_max_length,
                        padding=False,
                        return_attention_mask=False,
                        return_token_type_ids=False,
                        add_special_tokens=False,
                    )
                item["input_ids"] = item["input_ids"] + sep_inputs + prompt_inputs
                item["attention_mask"] = [1] * len(item["input_ids"])
                item.pop("token_type_ids") if "token_type_ids" in item.keys() else None
                batch_inputs.append(item)
            # Collater: tokenizer.pad(padding=True, max_length=encode_max_length, pad_to_multiple_of=8)
            batch = tokenizer.pad(
                [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in batch_inputs],
                padding=True,
                max_length=encode_max_length,
                pad_to_multiple_of=8,
                return_tensors="pt",
            )
            logits = model(**batch, output_hidden_states=True).logits
            # last_logit_pool
            attention_mask = batch["attention_mask"]
            if attention_mask[:, -1].sum() == attention_mask.shape[0]:
                pooled = logits[:, -1, :]
            else:
                lengths = attention_mask.sum(dim=1) - 1
                pooled = torch.stack([logits[i, lengths[i], :] for i in range(logits.shape[0])], dim=0)
            all_scores.extend(pooled[:, yes_loc].cpu().float().tolist())
    all_scores = [all_scores[idx] for idx in np.argsort(length_sorted_idx)]
    if normalize:
        all_scores = [1 / (1 + math.exp(-score)) for score in all_scores]  # FlagEmbedding's sigmoid
    return all_scores


def test_bge_reranker_v2_gemma_is_flagembeddings_raw_yes_logit(gemma_reranker):
    """The profile's score is FlagLLMReranker.compute_score's number (the raw 'Yes' logit at the prompt's last
    token), and with label_score sigmoid its normalize=True number; both orders equal the reference's."""
    reference = np.array(flag_llm_reranker_compute_score(gemma_reranker, pairs())).reshape(len(QUERIES), -1)
    got = engine_scores(gemma_reranker)  # picked by the directory's name, as by the hub id
    assert np.max(np.abs(got - reference)) <= 1e-5, (got, reference)
    assert (np.argsort(-got, axis=1) == np.argsort(-reference, axis=1)).all()
    assert not ((got >= 0) & (got <= 1)).all()  # a logit, not a probability

    normalized = np.array(flag_llm_reranker_compute_score(gemma_reranker, pairs(), normalize=True))
    sigmoid = engine_scores(gemma_reranker, profile="bge-reranker-v2-gemma", label_score="sigmoid")
    assert np.max(np.abs(sigmoid - normalized.reshape(len(QUERIES), -1))) <= 1e-6


def test_bge_reranker_v2_gemma_sequence_is_flagembeddings(gemma_reranker):
    """Token for token: the engine's reference sequence of a pair is the one FlagEmbedding builds
    ([bos] + 'A: q' + '\\n' + 'B: p' + '\\n' + prompt, each piece tokenized on its own)."""
    profile = builtin_profiles()["bge-reranker-v2-gemma"].settings
    scorer = Scorer(gemma_reranker, device="cpu")
    assert scorer.profile is not None and scorer.profile.name == "bge-reranker-v2-gemma"
    tokenizer = AutoTokenizer.from_pretrained(gemma_reranker)
    plan = scorer.planner.plan([Group(query, ITEMS) for query in QUERIES])

    def piece(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for (query, item), (g, i) in zip(pairs(), itertools.product(range(len(QUERIES)), range(len(ITEMS)))):
        flag = [tokenizer.bos_token_id, *piece(f"A: {query}"), *piece("\n"), *piece(f"B: {item}")]
        flag += piece("\n") + piece(FLAG_PROMPT)
        assert plan.tokenized[g].reference_sequence(i) == flag
    assert profile["label_score"] == "logit" and profile["label_tokens"] == ("Yes",)


# --------------------------------------------------------------------------------- Qwen3-Reranker model card


def qwen3_reranker_model_card(model_dir: Path, queries: list[str], documents: list[str]) -> list[float]:
    """The Qwen3-Reranker model card's "Transformers Usage" code, transcribed (format_instruction,
    process_inputs, compute_logits; tokenizer padded on the left, max_length 8192)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    token_false_id = tokenizer.convert_tokens_to_ids("no")
    token_true_id = tokenizer.convert_tokens_to_ids("yes")
    max_length = 8192
    prefix_tokens = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)

    def format_instruction(instruction, query, doc):
        if instruction is None:
            instruction = "Given a web search query, retrieve relevant passages that answer the query"
        output = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}".format(  # noqa: UP032 (as the card)
            instruction=instruction, query=query, doc=doc
        )
        return output

    def process_inputs(pairs):
        inputs = tokenizer(
            pairs,
            padding=False,
            truncation="longest_first",
            return_attention_mask=False,
            max_length=max_length - len(prefix_tokens) - len(suffix_tokens),
        )
        for i, ele in enumerate(inputs["input_ids"]):
            inputs["input_ids"][i] = prefix_tokens + ele + suffix_tokens
        inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
        return inputs

    @torch.no_grad()
    def compute_logits(inputs, **kwargs):
        batch_scores = model(**inputs).logits[:, -1, :]
        true_vector = batch_scores[:, token_true_id]
        false_vector = batch_scores[:, token_false_id]
        batch_scores = torch.stack([false_vector, true_vector], dim=1)
        batch_scores = torch.nn.functional.log_softmax(batch_scores, dim=1)
        scores = batch_scores[:, 1].exp().tolist()
        return scores

    pairs = [format_instruction(QWEN3_TASK, query, doc) for query, doc in zip(queries, documents)]
    return compute_logits(process_inputs(pairs))


def test_qwen3_reranker_equals_the_model_cards_code(qwen3_reranker):
    queries, documents = zip(*pairs())
    reference = np.array(qwen3_reranker_model_card(qwen3_reranker, list(queries), list(documents)))
    got = engine_scores(qwen3_reranker)  # picked by the directory's name
    diff = np.max(np.abs(got - reference.reshape(len(QUERIES), -1)))
    assert diff <= 1e-5, diff
    assert (np.argsort(-got, axis=1) == np.argsort(-reference.reshape(len(QUERIES), -1), axis=1)).all()


# ------------------------------------------------------------------------------------------- yes-no-judge


def yes_no_judge_reference(model_dir: Path, query: str, item: str) -> float:
    """What the yes-no-judge profile's description says its number is, computed on a plain Hugging Face forward:
    the prompt 'Query: {query}\\nDocument: {item}\\nIs the document relevant to the query? Answer yes or no.\\n
    Answer:' (the query part encoded with the tokenizer's special tokens, the document part without), then
    softmax over the ' no' and ' yes' logits at its last token = sigmoid(logit(' yes') - logit(' no')), which is
    sentence-transformers' LogitScore(true_token_id=' yes', false_token_id=' no') under its Sigmoid activation."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tokenizer(f"Query: {query}\n")["input_ids"]
    ids += tokenizer(
        f"Document: {item}\nIs the document relevant to the query? Answer yes or no.\nAnswer:",
        add_special_tokens=False,
    )["input_ids"]
    no, yes = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" no", " yes"))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return torch.sigmoid(logits[yes] - logits[no]).item()


def test_yes_no_judge_is_p_yes_over_no_and_yes(zoo):
    model_dir = zoo.get("llama", "causal", add_bos=True)
    reference = np.array([yes_no_judge_reference(model_dir, q, i) for q, i in pairs()])
    got = engine_scores(model_dir, profile="yes-no-judge")
    assert np.max(np.abs(got - reference.reshape(len(QUERIES), -1))) <= 1e-5


# --------------------------------------------------------------------------------- every profile's own text


def test_every_builtin_profile_says_what_its_number_is_and_what_it_equals():
    """Each description names its number and its reference, and what it says of its settings is true."""
    profiles = builtin_profiles()
    assert set(profiles) == {"bge-reranker-v2-gemma", "qwen3-reranker", "yes-no-judge"}  # each tested above
    for name, profile in profiles.items():
        assert "score = " in profile.description and "equals " in profile.description, name
        ScoringConfig(**profile.settings)  # every profile is a valid ScoringConfig
    bge = profiles["bge-reranker-v2-gemma"]
    assert "raw logit of 'Yes'" in bge.description and "FlagLLMReranker.compute_score" in bge.description
    assert "--label-score sigmoid" in bge.description and bge.settings["label_score"] == "logit"
    qwen3 = profiles["qwen3-reranker"]
    assert "P(yes)" in qwen3.description and "model card" in qwen3.description
    assert qwen3.settings["apply_softmax"] is True and qwen3.settings["label_tokens"] == ("no", "yes")
    judge = profiles["yes-no-judge"]
    assert "P(yes)" in judge.description and judge.settings["label_tokens"] == (" no", " yes")


# ------------------------------------------------------------------------- ScoringConfig.label_score itself


def test_label_score_modes_from_the_head():
    torch.manual_seed(0)
    rows, weight, bias = torch.randn(3, 8), torch.randn(20, 8), torch.randn(20)
    labels = torch.tensor([4, 11])
    logits = rows @ weight.T + bias
    assert torch.allclose(
        label_scores(rows, weight, bias, labels, False, None, label_score="logit"), logits[:, labels]
    )
    assert torch.allclose(
        label_scores(rows, weight, bias, labels, False, None, label_score="sigmoid"),
        logits[:, labels].sigmoid(),
    )
    capped = label_scores(rows, weight, bias, labels, False, 2.0, label_score="logit")
    assert torch.allclose(capped, 2.0 * torch.tanh(logits[:, labels] / 2.0))  # Gemma 2's final soft-capping
    probability = label_scores(rows, weight, bias, labels, False, None)
    assert torch.allclose(probability, logits.softmax(-1)[:, labels])
    with pytest.raises(ValueError, match="label_score"):
        label_scores(rows, weight, bias, labels, False, None, label_score="odds")


def test_label_score_setting_is_checked():
    with pytest.raises(SettingError, match="ScoringConfig.label_score"):
        ScoringConfig(label_score="odds")
    with pytest.raises(SettingError, match="apply_softmax"):
        ScoringConfig(label_tokens=(" no", " yes"), apply_softmax=True, label_score="logit")
    assert ScoringConfig(label_score="sigmoid").label_score == "sigmoid"


def test_label_score_on_a_causal_model_against_plain_hf(zoo, copy_model):
    """logit and sigmoid on a plain Llama CausalLM: the labels' logits at the last token of query + item."""
    model_dir = copy_model(zoo.get("llama", "causal", add_bos=True))
    (model_dir / "score_batch.json").write_text(json.dumps({"label_tokens": [" no", " yes"]}))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    labels = [tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in (" no", " yes")]
    expected = []
    with torch.no_grad():
        for query, item in pairs():
            ids = tokenizer(query)["input_ids"] + tokenizer(item, add_special_tokens=False)["input_ids"]
            expected.append(model(torch.tensor([ids])).logits[0, -1, labels].numpy())
    expected = np.array(expected)  # [pairs, 2]
    scorer = Scorer(model_dir, device="cpu", label_score="logit")
    results = scorer.score([Group(query, ITEMS) for query in QUERIES])
    got = np.concatenate([result.scores for result in results])
    assert np.max(np.abs(got - expected)) <= 1e-5
    sigmoid = engine_scores(model_dir, label_score="sigmoid")
    assert np.max(np.abs(sigmoid.ravel() - 1 / (1 + np.exp(-expected[:, 1])))) <= 1e-6


def test_label_score_is_refused_on_a_classifier_and_named_in_the_activation(zoo):
    from score_batch.engine import EngineConfig, Scorer, ScoringConfig, SettingError

    with pytest.raises(SettingError, match="applies to CausalLM label tokens"):
        Scorer.load(
            zoo.get("qwen3", "classifier"),
            EngineConfig(device="cpu", scoring=ScoringConfig(label_score="logit")),
        )
    causal = Scorer.load(
        zoo.get("qwen3", "causal"),
        EngineConfig(device="cpu", scoring=ScoringConfig(label_tokens=(" to",), label_score="logit")),
    )
    assert causal.activation.name == "none" and "label_score=logit" in causal.activation.reason
