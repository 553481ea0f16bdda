"""Groups → tokenized groups → packs → batches, plus the counts a run report needs (no model)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from score_batch.engine.config import SGLANG_DEFAULT_DELIMITER, ScoringConfig
from score_batch.engine.errors import SettingError
from score_batch.engine.plan.batching import Batch, make_batches
from score_batch.engine.plan.packing import ItemRef, Pack, cached_mis_pack, mis_pack, single_pack, split_items
from score_batch.engine.text.chunking import ChunkedGroup, check_chunk_settings, chunk_group
from score_batch.engine.text.encode import EncodedTexts
from score_batch.engine.text.pairs import (
    PairBatch,
    PairGroup,
    duplicate_pairs,
    encode_pairs,
    make_pair_batches,
)
from score_batch.engine.text.tokenize import (
    TokenizedGroup,
    encode_groups,
    tokenize_group,
    without_unscored_tail,
)
from score_batch.engine.types import FlatItems, Group


@dataclass(frozen=True)
class PlanLimits:
    """Token budgets and the delimiter, resolved for one model and device."""

    max_pack_tokens: int
    max_batch_tokens: int
    delimiter_token_id: int
    vocab_size: int
    isolate_sequences: bool = False
    pair_max_length: int | None = None  # encoder cross-encoders: the longest (query, item) pair
    pad_token_id: int = 0
    # The model's position limit (max_position_embeddings) for decoders: every reference sequence
    # (query + item) must fit it; None when the model has no such limit (encoders use pair_max_length).
    max_positions: int | None = None
    # A group needing several MIS packs computes its query once: its later packs read the first pack's
    # per-layer query K/V from the run's QueryCache (only for backends whose capabilities say cached_query).
    cache_query: bool = False
    # Repeated (query, item) sequences of one call are scored once and copied (PackedPlan.copies).
    dedupe: bool = True
    # Trailing tokens of this id end no reference sequence (ModelInfo.unscored_tail_id): dropped after truncation.
    unscored_tail_id: int | None = None


@dataclass
class PlanStats:
    """Counts of one plan: what will run and what a pairwise run would have cost."""

    groups: int = 0
    items: int = 0
    # sequences the model scores: the items that tokenized, or under truncate="chunk" their chunks
    sequences: int = 0
    packs: int = 0
    batches: int = 0
    packed_tokens: int = 0  # tokens the forward passes run (a cached pack's query is not among them)
    pairwise_tokens: int = 0
    duplicates: int = 0  # scored sequences equal to an earlier one of the call: scored once, copied


@dataclass
class PackedPlan:
    """Everything decided before the forward passes of one call, for packed (decoder) scoring."""

    tokenized: list[TokenizedGroup]  # as the pairs hold them (truncated; pad-id tails included)
    scored: list[TokenizedGroup]  # what the packs score (ItemRef indexes it): tokenized without the pad-id
    # tails a classifier is not read at (tokenize.without_unscored_tail), flattened to chunks under chunk
    batches: list[Batch]
    stats: PlanStats = field(default_factory=PlanStats)
    # truncate="chunk": each group's chunks, which the packs' ItemRefs index instead of its items
    chunked: list[ChunkedGroup] | None = None
    # a scored sequence → the later ones equal to it (same query and item tokens): those are not packed
    copies: dict[ItemRef, tuple[ItemRef, ...]] = field(default_factory=dict)
    # the tokenizer's encodings when plan was given them (a pipeline's tokenize stage): held so that they are
    # freed with the plan by the thread that drops it after scoring, not by the packing thread; None otherwise
    encoded: object = field(default=None, repr=False, compare=False)

    def item_name(self, ref: ItemRef) -> str:
        """A scored item as error messages name it: "item 3", or "item 3 (chunk 2 of 5)" under chunk."""
        return f"item {ref.item}" if self.chunked is None else self.chunked[ref.group].chunk_name(ref.item)


@dataclass
class PairPlan:
    """Everything decided before the forward passes of one call, for unpacked encoder pairs."""

    tokenized: list[PairGroup]  # the encoded pairs of each group (named as PackedPlan's for callers)
    batches: list[PairBatch]
    stats: PlanStats = field(default_factory=PlanStats)
    chunked: None = None  # encoders are never chunked (engine/text/chunking.check_chunk_settings)
    # a scored pair → the later ones equal to it (same input and token type ids): those are not batched
    copies: dict[ItemRef, tuple[ItemRef, ...]] = field(default_factory=dict)

    def item_name(self, ref: ItemRef) -> str:
        """A pair as error messages name it: "item 3"."""
        return f"item {ref.item}"


@dataclass(frozen=True)
class PackedPlanner:
    """Plans packed calls for one tokenizer, scoring config and limits (no model needed: dry runs use it)."""

    tokenizer: object
    cfg: ScoringConfig
    limits: PlanLimits

    def __post_init__(self) -> None:
        check_chunk_settings(self.cfg, encoder=False)

    def encode(self, groups: list[Group]) -> list[tuple | None]:
        """The texts of the groups in two tokenizer calls (plan's first step; a pipeline may run it apart)."""
        return encode_groups(groups, self.tokenizer, self.cfg)

    def plan(self, groups: list[Group], encoded: list[tuple | None] | None = None) -> PackedPlan:
        """Tokenize (unless given the groups' `encode`), pack (MIS or single) and batch the groups of one call.
        Under truncate="chunk" the packs score every item's chunks as items of its group (plan.chunked)."""
        cfg, limits = self.cfg, self.limits
        given = encoded
        if encoded is None:
            encoded = self.encode(groups)
        tokenized = [
            tokenize_group(
                g, self.tokenizer, cfg, limits.max_pack_tokens, limits.vocab_size, limits.max_positions, e
            )
            for g, e in zip(groups, encoded)
        ]
        read = [without_unscored_tail(g, limits.unscored_tail_id) for g in tokenized]
        chunked = [chunk_group(g) for g in read] if cfg.truncate == "chunk" else None
        scored = read if chunked is None else [c.scored for c in chunked]
        arrays = [_as_encoded(group, e) for group, e in zip(scored, encoded)]
        copies = duplicate_sequences(scored, arrays) if limits.dedupe else {}
        skipped: list[set[int]] = [set() for _ in scored]  # per group: the repeats it does not pack
        for refs in copies.values():
            for ref in refs:
                skipped[ref.group].add(ref.item)
        packs: list[Pack] = []
        for group_index, (group, items) in enumerate(zip(scored, arrays)):
            packs.extend(_group_packs(group_index, group, cfg, limits, skipped[group_index], items))
        budget = 1 if limits.isolate_sequences else limits.max_batch_tokens
        batches = make_batches(packs, budget)
        stats = PlanStats(
            groups=len(groups),
            items=sum(len(g.item_ids) for g in tokenized),
            sequences=sum(len(g.item_ids) - g.item_ids.count(None) for g in scored) - sum(map(len, skipped)),
            duplicates=sum(map(len, skipped)),
            packs=len(packs),
            batches=len(batches),
            packed_tokens=sum(len(p) for p in packs),
            pairwise_tokens=sum(map(_pair_tokens, tokenized, encoded)),
        )
        return PackedPlan(tokenized, scored, batches, stats, chunked, copies, given)


@dataclass(frozen=True)
class PairPlanner:
    """Plans encoder cross-encoder calls: (query, item) pairs, padded and batched (no packing)."""

    tokenizer: object
    cfg: ScoringConfig
    limits: PlanLimits

    def __post_init__(self) -> None:
        check_chunk_settings(self.cfg, encoder=True)

    def encode(self, groups: list[Group]) -> None:
        """Nothing ahead of plan: pairs are encoded by the tokenizer's own pair call in plan."""
        return None

    def plan(self, groups: list[Group], encoded: None = None) -> PairPlan:
        """Encode (query, item) pairs and batch them padded; a pair repeated in the call is batched once (its
        repeats copied: plan.copies)."""
        limits = self.limits
        encoded = [encode_pairs(g, self.tokenizer, self.cfg, limits.pair_max_length) for g in groups]
        copies = duplicate_pairs(encoded) if limits.dedupe else {}
        skip = frozenset(ref for refs in copies.values() for ref in refs)
        batches = make_pair_batches(encoded, limits.max_batch_tokens, limits.pad_token_id, skip)
        stats = PlanStats(
            groups=len(groups),
            items=sum(len(g.item_ids) for g in encoded),
            sequences=sum(ids is not None for g in encoded for ids in g.item_ids) - len(skip),
            duplicates=len(skip),
            packs=sum(len(b.item_refs) for b in batches),
            batches=len(batches),
            packed_tokens=sum(b.num_tokens for b in batches),
            pairwise_tokens=sum(len(ids) for g in encoded for ids in g.item_ids if ids is not None),
        )
        return PairPlan(tokenized=encoded, batches=batches, stats=stats, copies=copies)


# Names for callers that hold either kind (the job layer); the engine picks one kind at load.
Planner = PackedPlanner | PairPlanner
WorkPlan = PackedPlan | PairPlan


def _as_encoded(group: TokenizedGroup, encoded: tuple | None) -> FlatItems | None:
    """The group's item ids as arrays when it scores its encodings' ids as they are (the common case: views of
    the tokenizer call's ids, flattened once), else None."""
    if encoded is None or not isinstance(encoded[1], EncodedTexts) or group.item_ids is not encoded[1].ids:
        return None
    return encoded[1].tokens()


def _pair_tokens(group: TokenizedGroup, encoded: tuple | None) -> int:
    """TokenizedGroup.pair_tokens, from the item arrays where the group has them."""
    if (arrays := _as_encoded(group, encoded)) is None:
        return group.pair_tokens()
    return len(group.query_ids) * len(arrays.lens) + int(arrays.lens.sum())  # every item fit, none chunked


def duplicate_sequences(
    groups: list[TokenizedGroup], arrays: list[FlatItems | None] | None = None
) -> dict[ItemRef, tuple[ItemRef, ...]]:
    """Each scored sequence that later ones repeat exactly (same query and item tokens, same order) → those
    repeats, across the call's groups: they are scored once and copied (pure; no model). Only items whose
    hash another item shares are compared token by token (equal sequences hash alike); arrays: each group's
    items as arrays (_as_encoded) where it has them, else they are made from its lists."""
    queries: dict[tuple, int] = {}  # each distinct query's tokens → a small code (items key on the code)
    codes = [queries.setdefault((g.item_first, tuple(g.query_ids)), len(queries)) for g in groups]
    arrays = [
        FlatItems.of([ids or [] for ids in g.item_ids]) if a is None else a
        for g, a in zip(groups, arrays or [None] * len(groups))
    ]
    # (query code, item tokens) → (group, item) of its first sequence
    first: dict[tuple, tuple[int, int]] = {}
    copies: dict[ItemRef, list[ItemRef]] = {}
    for g, candidates in enumerate(_hash_candidates(codes, arrays)):
        for i in candidates:
            ids = groups[g].item_ids[i]
            if ids is None:
                continue
            original = first.setdefault((codes[g], tuple(ids)), (g, i))
            if original[0] != g or original[1] != i:  # an earlier sequence of the same tokens
                copies.setdefault(ItemRef(*original), []).append(ItemRef(g, i))
    return {original: tuple(refs) for original, refs in copies.items()}


def _hash_candidates(codes: list[int], arrays: list[FlatItems]) -> list[list[int]]:
    """Per group, its items whose (query code, tokens) hash some other item of the call shares, in order."""
    if not arrays:
        return []
    flat = np.concatenate([a.tokens for a in arrays]).astype(np.uint64)  # [tokens]
    lens = np.concatenate([a.lens for a in arrays])  # [items]
    starts = np.cumsum(lens) - lens  # [items]
    within = np.arange(len(flat)) - np.repeat(starts, lens)  # [tokens] index in its item
    powers = np.cumprod(np.full(int(lens.max(initial=0)) + 1, 0x100000001B3, np.uint64))  # wraps mod 2**64
    sums = np.zeros(len(flat) + 1, np.uint64)
    np.cumsum((flat + np.uint64(1)) * powers[within], out=sums[1:])
    hashes = sums[starts + lens] - sums[starts]  # [items] a polynomial hash of each item's tokens
    per_group = np.fromiter((len(a.lens) for a in arrays), np.int64, len(arrays))
    query = np.repeat(np.asarray(codes, np.uint64), per_group)  # [items]
    hashes = hashes * np.uint64(0x9E3779B97F4A7C15) + lens.astype(np.uint64) * np.uint64(31) + query
    _, inverse, counts = np.unique(hashes, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts[inverse] > 1)  # [candidates] item positions across the call
    group_of = np.repeat(np.arange(len(arrays)), per_group)
    first_item = np.cumsum(per_group) - per_group
    out: list[list[int]] = [[] for _ in arrays]
    for g, position in zip(group_of[shared].tolist(), shared.tolist()):
        out[g].append(position - int(first_item[g]))
    return out


def _group_packs(
    group_index: int,
    group: TokenizedGroup,
    cfg: ScoringConfig,
    limits: PlanLimits,
    skip: set[int],
    arrays: FlatItems | None = None,
) -> list[Pack]:
    """The packs of one group: one per item when single/item-first, else MIS runs under the pack limit. With
    limits.cache_query, a group of several runs computes its query once (see _query_once_packs). Items in skip
    (repeats of an earlier sequence) are left out. arrays: the items' ids as arrays (_as_encoded), or None."""
    item_ids = group.item_ids
    if skip or None in item_ids:
        valid = [i for i, ids in enumerate(item_ids) if ids is not None and i not in skip]
    else:  # the common case: every item is packed
        valid = list(range(len(item_ids)))
    if cfg.packing == "single" or group.item_first:
        return [single_pack(group.reference_sequence(i), ItemRef(group_index, i)) for i in valid]
    if arrays is not None:
        item_lens = arrays.lens[valid] if len(valid) != len(item_ids) else arrays.lens
    else:
        item_lens = [len(item_ids[i]) for i in valid]
    if limits.cache_query and 0 in item_lens:
        # Empty items score at the query's last token: first, so that they land in the inline pack.
        valid = [i for i, n in zip(valid, item_lens) if not n] + [i for i, n in zip(valid, item_lens) if n]
        item_lens = [len(item_ids[i]) for i in valid]
    runs = split_items(len(group.query_ids), item_lens, limits.max_pack_tokens)
    if len(valid) != len(item_ids) or valid != list(range(len(valid))):  # positions in valid → item indices
        runs = [[valid[k] for k in run] for run in runs]
    if limits.cache_query and len(runs) > 1:
        return _query_once_packs(group_index, group, runs, limits.delimiter_token_id)
    return [_inline_pack(group_index, group, run, limits.delimiter_token_id, None, arrays) for run in runs]


def _inline_pack(
    group_index: int,
    group: TokenizedGroup,
    run: list[int],
    delimiter: int,
    query_key: int | None = None,
    arrays: FlatItems | None = None,
) -> Pack:
    """The MIS pack of a run of a group's items, query inline (arrays: the items' ids as arrays, or None)."""
    first, last = run[0], run[-1] + 1
    if run == list(range(first, last)):  # the common case, a run of consecutive items: a slice
        if arrays is not None:
            flat, lens = arrays
            bounds = (int(lens[:first].sum()), int(lens[:last].sum()))
            items = FlatItems(flat[bounds[0] : bounds[1]], lens[first:last])
        else:
            items = group.item_ids[first:last]
    else:
        items = [group.item_ids[i] for i in run]
    return mis_pack(group.query_ids, items, item_refs(group_index, run), delimiter, query_key)


def item_refs(group_index: int, items: list[int]) -> list[ItemRef]:
    """ItemRef(group_index, i) for each i, made without the NamedTuple's Python-level __new__ (per item: hot)."""
    return list(map(ItemRef._make, zip(itertools.repeat(group_index), items)))


def _query_once_packs(
    group_index: int, group: TokenizedGroup, runs: list[list[int]], delimiter: int
) -> list[Pack]:
    """The first run inline (storing its query's K/V), later runs cached; a run with an empty item stays inline."""
    cached = [all(group.item_ids[i] for i in run) for run in runs[1:]]  # empty items need the query inline
    key = group_index if any(cached) else None
    packs = [_inline_pack(group_index, group, runs[0], delimiter, key)]
    for run, is_cached in zip(runs[1:], cached):
        if not is_cached:
            packs.append(_inline_pack(group_index, group, run, delimiter))
            continue
        items = [group.item_ids[i] for i in run]
        packs.append(
            cached_mis_pack(len(group.query_ids), items, item_refs(group_index, run), delimiter, group_index)
        )
    return packs


def resolve_label_ids(cfg: ScoringConfig, tokenizer, kind: str, vocab_size: int) -> tuple[int, ...]:
    """Turn label tokens or ids into validated ids (CausalLM); classifiers ignore labels."""
    if kind != "causal":
        return ()
    ids = list(cfg.label_token_ids)
    for token in cfg.label_tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise SettingError(
                "ScoringConfig.label_tokens",
                cfg.label_tokens,
                f"has {token!r}, which encodes to {len(encoded)} tokens {encoded}; each label must be exactly one "
                "token (check the leading space, or give the labels as ScoringConfig.label_token_ids)",
            )
        ids.append(encoded[0])
    name = "label_tokens" if cfg.label_tokens else "label_token_ids"
    setting, value = f"ScoringConfig.{name}", getattr(cfg, name)
    if not ids:
        raise SettingError(
            setting, value, "is empty: a CausalLM model needs label tokens to score, e.g. (' no', ' yes')"
        )
    if len(set(ids)) != len(ids):
        raise SettingError(setting, value, f"contains duplicates (token ids {ids})")
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise SettingError(
                setting, value, f"has token id {token_id}, outside the vocabulary [0, {vocab_size})"
            )
    return tuple(ids)


def default_delimiter(requested: int | None, tokenizer, vocab_size: int) -> int:
    """SGLang's 9999 when it is in the vocabulary, else the pad/eos token (its id never changes a score)."""
    if requested is not None:
        if not 0 <= requested < vocab_size:
            raise SettingError(
                "ScoringConfig.delimiter_token_id", requested, f"is outside the vocabulary [0, {vocab_size})"
            )
        return requested
    if SGLANG_DEFAULT_DELIMITER < vocab_size:
        return SGLANG_DEFAULT_DELIMITER
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if candidate is not None and 0 <= candidate < vocab_size:
            return candidate
    return 0
