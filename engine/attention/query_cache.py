"""The query computed once per group: its per-layer K/V, stored by the group's first pack for its cached packs.

A group whose items need several packs runs its query only in its first pack (`Pack.stores_query`); its
later packs (`Pack.query_cached`) hold no query tokens, and their attention reads the query's keys and
values that the first pack stored, layer by layer. make_batches runs a cached pack in its storing pack's
batch or a later one. One QueryCache serves one plan's batches, in order:

    cache = QueryCache(plan.batches)
    for batch in plan.batches:
        attention_plan = backend.plan(batch, device, cache)  # attend() puts, then gets
        ...  # the forward pass
        cache.release(batch)

Values are opaque: each backend stores the layout it attends with. The torch helpers below store the
SDPA backends' layout, (key, value) tensors [kv_heads, q, head_dim].
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from score_batch.engine.plan.batching import Batch
from score_batch.engine.plan.packing import Pack


class QueryCache:
    """Per-layer query K/V of the groups whose cached packs have not all run yet."""

    def __init__(self, batches: Iterable[Batch]) -> None:
        # key → cached packs still to run
        self._pending: Counter[int] = Counter(p.query_key for b in batches for p in b.packs if p.query_cached)
        self._entries: dict[tuple[int, int], object] = {}  # (key, layer) → the backend's value

    def put(self, key: int, layer: int, value: object) -> None:
        """Store a group's query K/V of one layer (the storing pack's batch, before any cached pack reads it)."""
        self._entries[(key, layer)] = value

    def get(self, key: int, layer: int) -> object:
        """The stored query K/V of a group and layer; a clear error when its storing pack has not run."""
        try:
            return self._entries[(key, layer)]
        except KeyError:
            raise KeyError(
                f"query cache has no entry for group {key}, layer {layer}: its storing pack must run "
                "in this batch or an earlier one of the same plan (make_batches' order)"
            ) from None

    def release(self, batch: Batch) -> None:
        """After a batch ran: count its cached packs as run and drop the entries no cached pack still needs."""
        for pack in batch.packs:
            if pack.query_cached:
                self._pending[pack.query_key] -= 1
        done = [k for k in self._entries if self._pending[k[0]] <= 0]
        for entry in done:
            del self._entries[entry]
        self._pending = +self._pending  # forget keys with nothing left to run

    def needed(self, key: int) -> bool:
        """Whether cached packs of this key are still to run (a storing pack may skip its put otherwise)."""
        return self._pending[key] > 0

    def __len__(self) -> int:
        """Stored (key, layer) entries."""
        return len(self._entries)

    @property
    def keys(self) -> set[int]:
        """The groups with stored entries."""
        return {key for key, _ in self._entries}


def store_query_kv(
    cache: QueryCache | None,
    batch: Batch,
    key: torch.Tensor,  # [1, kv_heads, num_tokens, head_dim]
    value: torch.Tensor,  # [1, kv_heads, num_tokens, head_dim]
    layer: int,
) -> None:
    """Put every storing pack's query K/V of this layer, contiguous copies [kv_heads, q, d] (never views)."""
    if cache is None:
        return
    starts = batch.cu_seqlens
    for pack_id, pack in enumerate(batch.packs):
        if pack.stores_query and cache.needed(pack.query_key):
            s, e = int(starts[pack_id]), int(starts[pack_id]) + pack.prefix_len
            # A copy: a view would keep the whole layer's [kv_heads, tokens, d] K/V alive with it.
            kv = (key[0, :, s:e], value[0, :, s:e])  # [kv_heads, q, d] views
            cache.put(
                pack.query_key, layer, tuple(t.clone(memory_format=torch.contiguous_format) for t in kv)
            )


def cached_query_kv(cache: QueryCache | None, pack: Pack, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached pack's query (key, value), each [kv_heads, q, d]."""
    if cache is None:
        raise ValueError(
            "a pack with query_cached needs the run's QueryCache (backend.plan(..., query_cache))"
        )
    return cache.get(pack.query_key, layer)


def check_cache(batch: Batch, cache: QueryCache | None) -> None:
    """Refuse a batch with cached packs when no QueryCache is given (at plan time, before any layer runs)."""
    if cache is None and any(p.query_cached for p in batch.packs):
        raise ValueError(
            "this batch has packs whose query K/V come from a QueryCache, but backend.plan got none: "
            "pass the run's QueryCache (backend.plan(batch, device, cache)) or plan with "
            "PlanLimits.cache_query=False"
        )
