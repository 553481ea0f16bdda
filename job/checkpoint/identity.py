"""A run's identity: the settings that decide its output rows, the model's content and the scoring software's
versions, computed once per run after preflight. The checkpoint manifest's digest, a completed output's record
(`completed`) and every pair's score key (`score_key`) derive from it. Not in it: what a run does with its
rows and settings that keep scores within the batch-invariance bound (window rows: beside, as `layout`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
from typing import TYPE_CHECKING

from score_batch import __version__
from score_batch.job.checkpoint.input_digest import InputDigest
from score_batch.job.checkpoint.model_digest import model_identity
from score_batch.machine import device_name

if TYPE_CHECKING:
    from score_batch.job.run_config import RunConfig

# What a run does with its output rows but not which rows: never in the identity (reuse: reused scores are the
# scores the run gives). The input and the model count by content (input, model), not by how a path is spelled.
UNFINGERPRINTED = (
    *("input", "model_dir", "resume", "overwrite", "report", "dry_run", "quiet", "errors_file", "output"),
    *("ray", "threads", "progress_seconds", "pipeline", "storage_options", "price_per_hour", "reuse"),
    *("reuse_missing_ok", "window_rows", "max_failed_rate"),
)
# scores stay within the batch-invariance bound (max_batch_tokens); verify re-scores a few items, changes none
INVARIANT_SETTINGS = (("engine", "max_batch_tokens"), ("engine", "verify"))
# The parts of a record that are digested, in this order (input: a completed output's only)
RECORD_PARTS = ("settings", "model", "input", "software")
RESOLVED_ENGINE = ("device", "dtype", "backend", "layers", "ops")  # in a score key as resolved, not as asked
SCORING_SOFTWARE = ("score-batch", "torch", "transformers", "tokenizers", "flashinfer-python")
# for refusal messages
FINGERPRINTED = "model, input, settings or score-batch/torch/transformers/tokenizers version"


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """What produced an output: its digest (compared) and the record it digests (to name a difference)."""

    digest: str
    record: dict  # {settings, model, software} (a completed output's: and input); layout beside

    @classmethod
    def of(cls, config: RunConfig) -> RunIdentity:
        """A run's identity (the model's files are digested once, then cached: model_digest.file_digests)."""
        settings = dataclasses.asdict(config)
        settings["engine"]["scoring"] = dataclasses.asdict(config.engine.scoring.deciding())
        for name in UNFINGERPRINTED:
            settings.pop(name)
        for owner, name in INVARIANT_SETTINGS:
            settings[owner].pop(name)
        record = {"settings": settings, "model": model_identity(config.model_dir), "software": software()}
        return cls._of(json.loads(json.dumps(record, sort_keys=True, default=str)))

    @classmethod
    def _of(cls, record: dict) -> RunIdentity:
        """The identity with a record's digest."""
        payload = json.dumps([record[k] for k in RECORD_PARTS if k in record], sort_keys=True, default=str)
        return cls(hashlib.sha256(payload.encode()).hexdigest(), record)

    def laid_out(self, window_rows: int) -> RunIdentity:
        """This identity with the window rows its parts are written with beside it (not digested)."""
        return dataclasses.replace(self, record={**self.record, "layout": {"window_rows": window_rows}})

    def with_failed(self, failed: int, items: int) -> RunIdentity:
        """This identity with the run's failed and total items beside it (not digested): a --resume of the
        completed output checks --max-failed-rate again."""
        return dataclasses.replace(self, record={**self.record, "failed": [failed, items]})

    def completed(self, input_digest: str) -> RunIdentity:
        """The identity an output completed from an input of this content digest records."""
        return self._of({**self.record, "input": [input_digest, InputDigest.VERSION.decode()]})

    def score_key(self, setup) -> bytes:
        """The 32-byte key of every pair's score key: this identity's model, engine settings and versions, and
        the engine as setup (a ResolvedSetup) resolved it on this machine."""
        engine = {k: v for k, v in self.record["settings"]["engine"].items() if k not in RESOLVED_ENGINE}
        resolved = {name: getattr(setup, name) for name in ("backend", "packing", "layers", "ops")}
        resolved.update(device=setup.device.type, dtype=str(setup.dtype), label_ids=list(setup.label_ids))
        resolved["gpu"] = device_name(str(setup.device)) if setup.device.type == "cuda" else None
        resolved["unscored_tail_id"] = setup.limits.unscored_tail_id  # a classifier's pad id
        # the scored text's templates, as engine/model/scored_text.py resolved them for this model directory
        resolved["text"] = [setup.text.query_template, setup.text.item_template]
        if getattr(setup, "fp8", "none") != "none":  # FP8 GEMMs: never a bf16 score (other keys unchanged)
            resolved["fp8"] = setup.fp8
        key = {"engine": engine, "resolved": resolved, **{k: self.record[k] for k in ("model", "software")}}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).digest()

    def difference(self, earlier: dict | None) -> str:
        """What differs from an earlier record, in words ('' when unknown: an output of an older version)."""
        if not isinstance(earlier, dict) or any(k in self.record and k not in earlier for k in RECORD_PARTS):
            return ""
        before, now = dict(earlier["software"]), dict(self.record["software"])
        said = _changed_settings(earlier["settings"], self.record["settings"])
        # Another score-batch may digest the same model or input differently: then only its version is named.
        same_build = before.get("score-batch") == now.get("score-batch")
        if earlier["model"] != self.record["model"] and same_build:
            said.append("the model's files changed (their content)")
        if earlier.get("input") != self.record.get("input") and same_build:
            digested = [(record.get("input") or [None])[1:] for record in (earlier, self.record)]
            if digested[0] != digested[1]:  # an older record: a digest without its version
                said.append(f"the input was digested another way then (now: {InputDigest.VERSION.decode()})")
            else:
                said.append("the input changed")
        said += [f"{name} {before.get(name)} → {new}" for name, new in now.items() if before.get(name) != new]
        return "; ".join(said)


def _changed_settings(before: dict, now: dict, prefix: str = "") -> list[str]:
    """'setting name old → new' for every setting that differs, nested configs by dotted name."""
    changed = []
    for key in sorted(now):  # a setting an older version recorded and this one no longer does is no change
        old, new = before.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed.extend(_changed_settings(old, new, f"{prefix}{key}."))
        elif old != new:
            changed.append(f"setting {prefix}{key} {json.dumps(old)} → {json.dumps(new)}")
    return changed


def software() -> list:
    """[name, version] of the packages that compute the scores (None: not installed; nothing imported): an
    upgrade between a killed run and its --resume must not mix scores."""
    versions = {**package_versions(SCORING_SOFTWARE), "score-batch": __version__}
    return [[name, versions[name]] for name in SCORING_SOFTWARE]


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions by package name, from package metadata (None: not installed; nothing imported)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found
