"""The input's digest (InputDigest): every window a run reads, hashed per column, the same however the input is
cut into windows; a window's own digest (window_digest) is its checkpoint part's check on --resume."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from score_batch.io_formats.window import Window, python


class InputDigest:
    """A digest of everything read, the same however the input is cut into windows: one hash per column (numbers
    as little-endian int64, queries by their digest, other values as JSON joined by ", "), combined at the end."""

    VERSION = b"score-batch input digest 2"

    def __init__(self) -> None:
        self._hashes: dict[str, Any] = {}

    def add(self, window: Window) -> str:
        """Feed one window's rows (the windows in input order); the window's own digest (window_digest)."""
        if window.num_rows == 0:
            return hashlib.sha256(self.VERSION).hexdigest()
        used, rows = np.unique(
            window.query_codes, return_inverse=True
        )  # a slice's rows use some of its values
        own = [query_digest(window.query_values[code]) for code in used.tolist() if code >= 0]
        digests = np.frombuffer((bytes(32) if used[0] < 0 else b"") + b"".join(own), np.uint8)  # -1: zeros
        columns: dict[str, Any] = {  # numbers as little-endian bytes, each query as its 32-byte digest
            "index": window.index.astype("<i8").tobytes(),
            "query": digests.reshape(-1, 32)[rows].tobytes(),
            "items": window.items,
            "offsets": np.diff(window.offsets).astype("<i8").tobytes(),
            "item_ids": python(window.item_ids),
            "errors": window.errors,
        }
        if window.query_ids is not None:
            columns["query_ids"] = python(window.query_ids)
        columns.update((f"kept {name}", python(values)) for name, values in window.kept.items())
        own = hashlib.sha256(self.VERSION)
        for name in sorted(columns):
            data = columns[name]
            if isinstance(data, list):  # JSON values of a list: joined by ", " across windows
                text = json.dumps(data, default=repr, sort_keys=True, ensure_ascii=False)[1:-1] + ", "
                data = text.encode("utf-8", "surrogatepass")
            state = self._hashes.get(name)
            if state is None:
                state = self._hashes[name] = hashlib.sha256()
            state.update(data)
            own.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        return own.hexdigest()

    def hexdigest(self) -> str:
        """The digest of every window added so far."""
        total = hashlib.sha256(self.VERSION)
        for name in sorted(self._hashes):
            total.update(name.encode() + b"\0" + self._hashes[name].digest())
        return total.hexdigest()


def window_digest(window: Window) -> str:
    """One window's digest (InputDigest.add's): a resumed run's check that a part's rows did not change."""
    return InputDigest().add(window)


def query_digest(query: Any) -> bytes:
    """A query's 32-byte SHA-256: text as UTF-8 behind a tag byte, token ids as their JSON."""
    if isinstance(query, str):
        return hashlib.sha256(b"t" + query.encode("utf-8", "surrogatepass")).digest()
    return hashlib.sha256(b"i" + json.dumps(query, default=repr).encode()).digest()
