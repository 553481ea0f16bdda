"""Texts encoded as the words of a few pre-tokenized sequences (engine/text/encode.encode_in_chunks) give each
text exactly the ids and offsets the tokenizers backend gives it on its own, for every kind of pipeline:
byte-level BPE, sentencepiece-like Metaspace (prepend "first" and "always"), a Prepend normalizer, BERT's
WordPiece with its normalizer, RoBERTa's offset trimming, word-level splits on digits, punctuation and
scripts, BPE with subword prefix and word suffix, and added tokens with every strip/word/normalized flag;
and that a window's texts through encode_texts (either path: one by one, or in chunks) get the ids and
content tokens of transformers' own __call__ per text, with and without a template and special tokens."""

from __future__ import annotations

import os
import random

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from score_batch.engine.text.encode import backend_encode, encode_in_chunks, encode_texts
from tests.tiny_models import BASE_CORPUS

ADDED = [
    AddedToken("<mask>", lstrip=True, special=True),
    AddedToken("[END]", rstrip=True, special=True),
    AddedToken("word", single_word=True, special=False),
    AddedToken("ﬁne", normalized=True, special=False),
    AddedToken("<|im_end|>", special=True, normalized=False),
]
PIECES = sorted({w for line in BASE_CORPUS for w in line.split()}) + [
    "<mask>", "[END]", "word", "words", "ﬁne", "fine", "<|im_end|>", "é", "e\u0301", "日本", "🙂", "  ", "\n",
    "\t", "Ünïcödé", "ﬁ", "_", "▁",
]  # fmt: skip


def _train(model, trainer, normalizer=None, pre_tokenizer=None, post=None) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(BASE_CORPUS * 5, trainer)
    if post is not None:
        tokenizer.post_processor = post
    tokenizer.add_tokens(ADDED)
    return tokenizer


def _kinds() -> dict:
    bpe = dict(vocab_size=300, special_tokens=["<unk>", "<s>"])
    return {
        "byte-level": lambda: _train(
            models.BPE(),
            trainers.BpeTrainer(**bpe, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False),
            post=processors.ByteLevel(trim_offsets=False),
        ),
        "byte-level-prefix": lambda: _train(
            models.BPE(),
            trainers.BpeTrainer(**bpe, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            normalizer=normalizers.NFC(),
            pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True),
            post=processors.ByteLevel(trim_offsets=True),
        ),
        "metaspace-first": lambda: _train(
            models.Unigram(),
            trainers.UnigramTrainer(vocab_size=200, special_tokens=["<unk>"], unk_token="<unk>"),
            pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="first"),
        ),
        "metaspace-always": lambda: _train(
            models.BPE(unk_token="<unk>"),
            trainers.BpeTrainer(**bpe),
            normalizer=normalizers.NFKC(),
            pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="always", split=False),
        ),
        "prepend-normalizer": lambda: _train(
            models.BPE(unk_token="<unk>", byte_fallback=True),
            trainers.BpeTrainer(**bpe),
            normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
            post=processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)]),
        ),
        "wordpiece": lambda: _train(
            models.WordPiece(unk_token="<unk>"),
            trainers.WordPieceTrainer(**bpe),
            normalizer=normalizers.BertNormalizer(lowercase=True, strip_accents=True),
            pre_tokenizer=pre_tokenizers.BertPreTokenizer(),
        ),
        "roberta-strip": lambda: _train(  # offsets trimmed without a kept prefix space: chunked as well
            models.BPE(),
            trainers.BpeTrainer(**bpe, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
            normalizer=normalizers.Strip(),
            pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True),
            post=processors.RobertaProcessing(("<s>", 1), ("<s>", 1), add_prefix_space=False),
        ),
        "split-word-level": lambda: _train(
            models.WordLevel(unk_token="<unk>"),
            trainers.WordLevelTrainer(special_tokens=["<unk>"]),
            normalizer=normalizers.Sequence(
                [normalizers.NFD(), normalizers.StripAccents(), normalizers.Replace(Regex(r"\s+"), " ")]
            ),
            pre_tokenizer=pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r"\d|_"), "isolated", invert=False), pre_tokenizers.Punctuation()]
                + [pre_tokenizers.UnicodeScripts(), pre_tokenizers.WhitespaceSplit()]
            ),
        ),
        "bpe-suffix": lambda: _train(
            models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"),
            trainers.BpeTrainer(**bpe, continuing_subword_prefix="##", end_of_word_suffix="</w>"),
            normalizer=normalizers.Lowercase(),
            pre_tokenizer=pre_tokenizers.Whitespace(),
            post=processors.BertProcessing(("<s>", 1), ("<s>", 1)),
        ),
    }


def _texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        pieces = [rng.choice(PIECES) for _ in range(rng.randint(0, 9))]
        glue = rng.choice(["", " ", "  "])
        out.append(rng.choice(["", " "]) + glue.join(pieces) + rng.choice(["", " ", "\n"]))
    return out + ["", " ", "<mask>", "[END] ", "word", "ﬁne"]


@pytest.mark.parametrize("kind", sorted(_kinds()))
@pytest.mark.parametrize("split_special", [False, True])
def test_each_text_as_on_its_own(kind, split_special):
    backend = _kinds()[kind]()
    backend.encode_special_tokens = split_special
    for count, seed in ((1, 0), (37, 1), (1500, 2)):  # one chunk, a few, many (with a short last chunk)
        texts = _texts(seed, count)
        for special in (False, True):
            if special and backend.num_special_tokens_to_add(False):
                continue  # each text gets its own specials: encoded one by one (backend_encode)
            ids, offsets = encode_in_chunks(backend, texts, special)
            alone = [backend.encode(text, add_special_tokens=special) for text in texts]
            assert len(ids) == len(offsets) == len(texts)
            assert ids == [a.ids for a in alone], kind
            assert [o.offsets for o in offsets] == [a.offsets for a in alone], kind
            middle = offsets[5:-3]  # a slice indexes the same texts
            assert [o.offsets for o in middle] == [a.offsets for a in alone[5:-3]]


def _keeps_first_space(post) -> Tokenizer:
    """Byte-level BPE after a normalizer that strips a text's leading spaces, its post-processor trimming
    offsets but keeping a first token's one added prefix space: it tells a first token by its offsets'
    start 0, which " b" stripped to "b" ((1, 2)) fails as a chunk's second word: encoded one by one."""
    return _train(
        models.BPE(),
        trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
        normalizer=normalizers.Strip(),
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True),
        post=post,
    )


TRANSFORMERS_KINDS = {
    "prepend-normalizer": _kinds()["prepend-normalizer"],  # a <s> the texts without specials must not get
    "strip-byte-level-trim": lambda: _keeps_first_space(processors.ByteLevel(trim_offsets=True)),
    "strip-roberta-in-sequence": lambda: _keeps_first_space(
        processors.Sequence([processors.RobertaProcessing(("<s>", 0), ("<s>", 0), add_prefix_space=True)])
    ),
}


@pytest.mark.parametrize("kind", sorted(TRANSFORMERS_KINDS))
def test_encode_texts_equals_transformers_call(kind):
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=TRANSFORMERS_KINDS[kind]())
    for count in (1, 8 * (os.cpu_count() or 1)):  # few texts: one by one; many: as chunks where it may
        contents = _texts(3, count) + [" a", "  b"]
        for template in (None, "Product: {item}!"):
            prefix, suffix = template.split("{item}") if template else ("", "")
            texts = [prefix + content + suffix for content in contents]
            for special in (False, True):
                theirs = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=True)
                ids, offsets = backend_encode(tokenizer, texts, special)
                assert ids == theirs["input_ids"], kind
                assert [o.offsets for o in offsets] == [list(map(tuple, o)) for o in theirs["offset_mapping"]]
                encoded = encode_texts(tokenizer, template, "{item}", contents, special)
                assert encoded.ids == ids and len(encoded) == len(contents)
                for content, ours, spans in zip(contents, encoded, theirs["offset_mapping"]):
                    start, end = len(prefix), len(prefix) + len(content)
                    spans = list(enumerate(spans))
                    assert ours.content == [i for i, (s, e) in spans if e > s and s >= start and e <= end]
                    assert ours.touching() == [i for i, (s, e) in spans if e > s and s < end and e > start]
