"""sentence-transformers 6.2's CrossEncoder predict and rank (and rank_many) over a Scorer's `score`/`run`.

Where no profile, label tokens or templates say otherwise, pairs are the token sequences CrossEncoder itself
builds (engine/model/st_model.py), scored in shared-prefix groups; a CausalLM scores by its LogitScore.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cached_property
from importlib import import_module

import numpy as np
import torch

from score_batch.engine import ce_arguments as ce
from score_batch.engine.activation import model_activation_fn
from score_batch.engine.errors import ScoringInputError
from score_batch.engine.model.scored_text import native_text, scored_config
from score_batch.engine.model.st_model import CrossEncoderSpec, pair_roles_failure, pair_tokens, saved_modules
from score_batch.engine.plan.planner import Planner
from score_batch.engine.types import Group, GroupResult

log = logging.getLogger(__name__)

_ITEM_NUMBER = re.compile(r"\bitem \d+\b")  # the item's index inside an internal group means nothing outside
# ScoringConfig.activation set explicitly → the activation predict and rank apply by default.
_REQUESTED = {"none": torch.nn.Identity, "sigmoid": torch.nn.Sigmoid, "softmax": lambda: torch.nn.Softmax(-1)}


class CrossEncoderAPI:
    """CrossEncoder's predict, rank and rank_many on the Scorer that inherits them (engine/scorer.py)."""

    def _attach_crossencoder(self, spec: CrossEncoderSpec | None, fn: Callable | None, prompted=None) -> None:
        """Set how pairs are encoded (spec None: as the engine's groups), their activation and the prompts."""
        self._spec, self._prompted_spec = spec, prompted
        # CrossEncoder's activation_fn; None for a CausalLM label scorer, whose `score` needs none.
        self.activation_fn = fn if fn is not None else self._default_activation_fn()
        self._ce_tokens = self._uses_ce_tokens()
        self.prompts: dict[str, str] = dict(prompted.prompts) if prompted else {}
        self.default_prompt_name: str | None = prompted.default_prompt_name if prompted else None
        if prompted and prompted.default_prompt and (failure := self._prompt_failure()):
            log.warning("the default prompt %r is not applied: %s", prompted.default_prompt, failure)

    @property
    def num_labels(self) -> int:
        """Scores per pair that predict returns: 1 for one-label heads and CausalLM scorers, as CrossEncoder."""
        return 1 if self._label_scorer else self.setup.info.num_labels  # a LogitScore runs as one label

    @property
    def max_length(self) -> int | None:
        """The longest pair in tokens: the tokenizer's model_max_length, as CrossEncoder's max_length."""
        return getattr(self.tokenizer, "model_max_length", None)

    max_seq_length = max_length

    @cached_property
    def config(self):
        """The model's transformers config, as CrossEncoder.config (ours: engine_config and scoring)."""
        config = getattr(self._runner.model.model, "config", None)
        if config is None:  # native decoder layers: no transformers module is built
            from transformers import AutoConfig

            path, trust = self.setup.info.path, self.engine_config.trust_remote_code
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust, local_files_only=True)
        return config

    def predict(
        self,
        inputs,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device=None,
        pool=None,
        chunk_size: int | None = None,
        *,
        batch_size_hint: int | None = None,
        return_errors: bool = False,
        **kwargs,
    ):
        """CrossEncoder.predict: the score of each (query, item) pair, in input order (docs/python-api.md)."""
        prompt = self._resolve_prompt(prompt, prompt_name)
        ce.check_batch_size(batch_size)
        ce.ignore_kwargs("predict", kwargs)
        singular = ce.is_singular_input(inputs)
        pairs = (
            [inputs] if singular else (inputs.tolist() if isinstance(inputs, np.ndarray) else list(inputs))
        )
        raw, score, errors = self._score_pairs(pairs, batch_size_hint, show_progress_bar, prompt)
        errors = [None if e is None else f"pairs[{i}]: {e}" for i, e in enumerate(errors)]
        ce.warn_failed(errors)
        values, fn = self._ce_logits(raw, score, activation_fn)
        device = self.setup.device
        result = ce.ce_outputs(
            values, fn, bool(apply_softmax), convert_to_numpy, convert_to_tensor, device, singular
        )
        return (result, errors) if return_errors else result

    def rank(
        self,
        query: ce.Text,
        documents: Sequence[ce.Text],
        top_k: int | None = None,
        return_documents: bool = False,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable | None = None,
        apply_softmax: bool | None = None,
        convert_to_numpy: bool | None = None,
        convert_to_tensor: bool | None = None,
        device=None,
        pool=None,
        chunk_size: int | None = None,
        **kwargs,
    ) -> list[dict]:
        """CrossEncoder.rank: documents best first as {"corpus_id", "score"} (+ "text"), docs/python-api.md."""
        ce.ignore_kwargs("rank", kwargs)
        return self.rank_many(
            [(query, documents)], top_k, return_documents, None, activation_fn, show_progress_bar,
            _prompts=(prompt_name, prompt), _batch_size=batch_size,
        )[0]  # fmt: skip

    def rank_many(
        self,
        queries_and_documents: Sequence[tuple[ce.Text, Sequence[ce.Text]]],
        top_k: int | None = None,
        return_documents: bool = False,
        batch_size_hint: int | None = None,
        activation_fn: Callable | None = None,
        show_progress_bar: bool | None = None,
        _prompts: tuple[str | None, str | None] = (None, None),
        _batch_size: int = 32,
    ) -> list[list[dict]]:
        """`rank` for many queries at once (scored together): one sorted list of records per (query, documents)."""
        prompt = self._resolve_prompt(_prompts[1], _prompts[0])
        ce.check_batch_size(_batch_size)
        if top_k is not None and not ce.whole(top_k, 0):
            raise ScoringInputError(f"top_k must be a non-negative integer or None, got {top_k!r}")
        groups = [ce.ranking_group(entry, index) for index, entry in enumerate(queries_and_documents)]
        pairs = [(group.query, item) for group in groups for item in group.items]
        raw, score, errors = self._score_pairs(pairs, batch_size_hint, show_progress_bar, prompt)
        values = self._ranking_values(raw, score, activation_fn)
        rankings, numbers, start = [], [], 0
        for number, group in enumerate(groups):
            records = [
                {"corpus_id": i, "score": values[start + i]} | ({"text": item} if return_documents else {})
                for i, item in enumerate(group.items)
                if not np.isnan(values[start + i])
            ]
            rankings.append(sorted(records, key=lambda record: record["score"], reverse=True)[:top_k])
            numbers += [number] * len(group.items)
            start += len(group.items)
        ce.warn_failed(
            [None if e is None else f"queries_and_documents[{n}]: {e}" for n, e in zip(numbers, errors)]
        )
        return rankings

    # --- helpers -------------------------------------------------------------------------------------

    @property
    def _label_scorer(self) -> bool:
        """A CausalLM scored by label tokens (a profile's or the caller's), not by a LogitScore."""
        return self.setup.info.kind == "causal"

    def _uses_ce_tokens(self) -> bool:
        """Whether pairs are CrossEncoder's token sequences (st_model.pair_tokens), as docs/python-api.md says."""
        spec, cfg, text = self._spec, self.scoring, self.setup.text
        if spec is None or self.setup.info.encoder or self._label_scorer or cfg.item_first:
            return False  # (an encoder's pair runner encodes as CrossEncoder anyway)
        if text.source in ("given", "item-first") or cfg.truncate not in ("longest-first", "error"):
            return False
        if spec.chat is None:
            return True
        failure = pair_roles_failure(self.tokenizer, spec.chat.message_format, spec.chat.template_kwargs)
        if failure is not None:
            log.warning(
                "CrossEncoder would refuse pairs for this model: its chat template cannot carry a "
                "query/document pair (%s); pairs are encoded as query + item instead",
                failure,
            )
        return failure is None

    def _ce_logits(
        self, raw: np.ndarray, score: np.ndarray, activation_fn: Callable | None
    ) -> tuple[np.ndarray, Callable]:
        """What CrossEncoder's activation runs on ([n, labels]) and the activation, for this model."""
        if not self._label_scorer:
            return raw, activation_fn if activation_fn is not None else self.activation_fn
        if activation_fn is None:
            return score[:, None], torch.nn.Identity()  # [n, 1] the `score` column, as the CLI's
        return ce.label_logit(raw, self.scoring.label_score, self.scoring.score_index)[:, None], activation_fn

    def _ranking_values(
        self, raw: np.ndarray, score: np.ndarray, activation_fn: Callable | None
    ) -> list[float]:
        """The values rank sorts by (rank's doc), as Python floats of float32 values."""
        if not self._label_scorer and activation_fn is None and raw.shape[1] != 1:
            return score.astype(np.float32).tolist()
        values, fn = self._ce_logits(raw, score, activation_fn)
        if not len(values):
            return []
        activated = fn(torch.from_numpy(np.ascontiguousarray(values, np.float32)))  # [n, labels]
        one = activated.ndim == 1 or activated.shape[1] == 1
        return (activated.reshape(-1) if one else activated[:, self.scoring.score_index]).float().tolist()

    def _default_activation_fn(self) -> Callable | None:
        """CrossEncoder's default activation for this model (ScoringConfig.activation wins when set)."""
        if self._label_scorer:
            return None
        if self.scoring.activation in _REQUESTED:
            return _REQUESTED[self.scoring.activation]()
        path = self.setup.info.path
        found = (
            self._spec.activation
            if self._spec
            else model_activation_fn(path, saved_modules(path) is not None)
        )
        if found is not None and (self.engine_config.trust_remote_code or found[0].startswith("torch.")):
            module, _, name = found[0].rpartition(".")
            try:
                return getattr(import_module(module), name)()
            except (ImportError, AttributeError, TypeError, ValueError) as error:
                raise ScoringInputError(
                    f"the model's {found[1]} names {found[0]}, which cannot be loaded: {error}"
                ) from error
        return torch.nn.Sigmoid() if self.setup.num_scores == 1 else torch.nn.Identity()

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """predict's prompt as CrossEncoder resolves it: prompt, else prompts[prompt_name], else the default."""
        if prompt is not None:
            if prompt_name is not None:
                log.warning(
                    "both prompt and prompt_name given: prompt_name is ignored, as CrossEncoder ignores it"
                )
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ScoringInputError(
                    f"prompt_name {prompt_name!r} is not one of the prompts' names {sorted(self.prompts)}"
                )
            return self.prompts[prompt_name]
        return self.prompts.get(self.default_prompt_name) if self.default_prompt_name is not None else None

    def _prompt_failure(self) -> str | None:
        """Why a prompt cannot go before each query as CrossEncoder puts it, or None."""
        if self._prompted_spec is None:
            return "the model was loaded with Scorer.load; use ScoringConfig.query_template"
        if self.setup.text.source in ("given", "item-first"):
            return "pairs are not CrossEncoder's text here (templates or item_first are given); use query_template"
        return None

    def _prompted(self, prompt: str | None) -> tuple[CrossEncoderSpec | None, Planner | None]:
        """The CrossEncoder spec and the planner (None: the runner's) that put `prompt` before each query."""
        spec, applies = self._spec, self._prompt_failure() is None
        if (prompt or None) == (self._prompted_spec.default_prompt if applies else None):
            return spec, None  # the prompt applied at load
        if not applies:
            raise ScoringInputError(f"prompt {prompt!r} cannot be applied: {self._prompt_failure()}")
        if self._ce_tokens:
            return replace(spec, default_prompt=prompt or None), None
        prompted = replace(self._prompted_spec, default_prompt=prompt or None)
        text = native_text(prompted, self.tokenizer, self.setup.info.encoder)  # as the groups' text at load
        planner = self._runner.planner
        return spec, replace(planner, cfg=scored_config(planner.cfg, text))

    def _score_pairs(
        self,
        pairs: list,
        batch_size_hint: int | None,
        show_progress_bar: bool | None,
        prompt: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
        """Raw outputs [n, labels], scores [n] and errors of (query, item) pairs, the prompt before each query."""
        from tqdm.auto import tqdm

        spec, planner = self._prompted(prompt)
        checked = [ce.pair_of(pair, index) for index, pair in enumerate(pairs)]
        raw = np.full((len(pairs), self.setup.num_scores), np.nan, np.float32)
        score = np.full(len(pairs), np.nan, np.float32)
        errors: list[str | None] = [None] * len(pairs)
        # Text pairs as CrossEncoder's token sequences where it applies; the others grouped by query.
        text = [i for i, (q, d) in enumerate(checked) if isinstance(q, str) and isinstance(d, str)]
        planned = set(text) if self._ce_tokens else set()
        groups = self._ce_token_groups(spec, checked, text, errors) if planned else []
        by_query: dict[object, tuple[ce.Text, list[ce.Text], list[int]]] = {}
        for index, (query, item) in enumerate(checked):
            if index not in planned:
                key = query if isinstance(query, str) else ("ids", tuple(query))
                by_query.setdefault(key, (query, [], []))[1].append(item)
                by_query[key][2].append(index)
        others = list(by_query.values())
        # CrossEncoder's token sequences are cut already: planned with truncate="error", never cut again.
        as_given = replace(self._runner.planner, cfg=replace(self._runner.planner.cfg, truncate="error"))
        with tqdm(total=len(pairs), desc="Scoring", unit="item", disable=not show_progress_bar) as bar:
            results = self._score_chunked(groups, batch_size_hint, bar.update, as_given)
            results += self._score_chunked(others, batch_size_hint, bar.update, planner)
        for (_, _, positions), result in zip(groups + others, results):
            raw[positions] = result.raw if result.raw is not None else result.scores
            score[positions] = result.score
            for position, error in zip(positions, result.failures):
                if error is not None:
                    errors[position] = _ITEM_NUMBER.sub("item", error)
        return raw, score, errors

    def _ce_token_groups(
        self, spec: CrossEncoderSpec, checked: list[tuple[ce.Text, ce.Text]], text: list[int], errors: list
    ) -> list[tuple[list[int], list[list[int]], list[int]]]:
        """Text pairs as CrossEncoder's token sequences in common-prefix groups; one that cannot run: an error."""
        truncate = self.scoring.truncate == "longest-first"
        sequences = pair_tokens(spec, self.tokenizer, [checked[i] for i in text], truncate)
        limits, limit = self.setup.limits, self.max_length
        fits = limits.max_pack_tokens - (0 if self.setup.packing == "single" else 2)  # MIS: two delimiters
        fits = fits if limits.max_positions is None else min(fits, limits.max_positions)
        by_query: dict[str, list[tuple[int, list[int]]]] = {}
        for index, ids in zip(text, sequences):
            if not ids:
                errors[index] = "pair is empty after tokenization"
            elif not truncate and limit is not None and len(ids) > limit:
                errors[index] = (
                    f"pair has {len(ids)} tokens, over the model's limit of {limit} (set truncate to "
                    "longest-first to cut it as CrossEncoder does)"
                )
            elif len(ids) > fits:
                errors[index] = (
                    f"pair has {len(ids)} tokens, more than a pack holds ({fits}); raise max_pack_tokens "
                    "(Scorer(model, max_pack_tokens=…)), or lower max_length"
                )
            else:
                by_query.setdefault(checked[index][0], []).append((index, ids))
        return [
            (query_ids, [ids for _, ids in items], [position for position, _ in items])
            for sequences_of_query in by_query.values()
            for query_ids, items in ce.prefix_groups(sequences_of_query)
        ]

    def _score_chunked(
        self, groups: list[tuple], batch_size_hint: int | None, on_items: Callable, planner: Planner | None
    ) -> list[GroupResult]:
        """(query, items, positions) groups planned (planner None: by score()), about batch_size_hint at a time."""
        if batch_size_hint is not None and not ce.whole(batch_size_hint, 1):
            raise ScoringInputError(
                f"batch_size_hint must be a positive integer or None, got {batch_size_hint!r}"
            )
        chunks: list[list[Group]] = []
        size = 0
        for query, items, _ in groups:
            if not chunks or (batch_size_hint is not None and size + len(items) > batch_size_hint):
                chunks.append([])
                size = 0
            chunks[-1].append(Group(query, items))
            size += len(items)
        if planner is None:
            return [result for chunk in chunks for result in self.score(chunk, on_items)]
        return [result for chunk in chunks for result in self.run(planner.plan(chunk), on_items)]
