"""The one check of a completion record as read back (a Parquet output's metadata, OUTPUT.done): every field's type
and shape before any is used, a wrong one refused (exit 2) in one line naming the record and the field."""

from __future__ import annotations

import json
import re

from score_batch.io_formats.errors import InputError

DIGEST = re.compile(r"[0-9a-f]{64}")
# the parts of an identity record (job/checkpoint/identity): the digested ones required (a checkpoint
# manifest's has no input), none of another shape, no other key
RECORD_FIELDS = ("settings", "model", "software", "input", "layout", "failed")
DIGESTED = ("settings", "model", "software", "input")
REMEDY = "drop --resume and pass --overwrite to score the output again"


class _Duplicate(Exception):
    """A JSON object that gives a key twice."""


def parsed(text: bytes | str, where: str) -> object:
    """A record's JSON, refused when it is not JSON (truncated, …), nests too deeply or gives a key twice."""
    try:
        return json.loads(text, object_pairs_hook=_unique)
    except _Duplicate as duplicate:
        raise _refusal(where, str(duplicate), "is given twice") from None
    except (ValueError, RecursionError) as error:
        reason = "nests too deeply" if isinstance(error, RecursionError) else f"({error})"
        raise InputError(f"the completion record {where} is not valid JSON {reason}; {REMEDY}") from None


def _unique(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: a dict, or _Duplicate naming the key given twice."""
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise _Duplicate(key)
        found[key] = value
    return found


def check_sidecar(value: object, where: str, dataset: bool) -> dict:
    """OUTPUT.done as written (job/checkpoint/completion.Completion.published): fingerprint, record, and the
    published output's [size, mtime] (a dataset: per file)."""
    published = "files" if dataset else "output"
    _object(value, where, "", required=("fingerprint", "record", published))
    check_fingerprint(value["fingerprint"], where, "fingerprint")
    check_record(value["record"], where, "record.")
    if dataset:
        files = value["files"]
        _object(files, where, "files")
        for path, stat in files.items():
            if not path or path.startswith("/"):
                raise _refusal(where, "files", f"names the file {path!r}, not a path below the output")
            _size_and_time(stat, where, f"files.{path}")
    else:
        _size_and_time(value["output"], where, "output")
    return value


def check_fingerprint(value: object, where: str, field: str = "fingerprint") -> str:
    """A record's fingerprint: a SHA-256 in hex."""
    if not isinstance(value, str) or not DIGEST.fullmatch(value):
        raise _refusal(where, field, f"is {_shown(value)}, not a SHA-256 digest in hex")
    return value


def check_record(value: object, where: str, prefix: str = "", required: tuple = DIGESTED) -> dict:
    """An identity record (job/checkpoint/identity.RunIdentity.record) of a completed output (required: the
    parts it must have)."""
    _object(value, where, prefix.rstrip("."), required=required, allowed=RECORD_FIELDS)
    if "settings" in value:
        _object(value["settings"], where, f"{prefix}settings")
    for name in ("model", "software"):
        if name in value:
            pairs = value[name]
            if not isinstance(pairs, list) or not all(_name_pair(pair, name == "software") for pair in pairs):
                raise _refusal(where, f"{prefix}{name}", f"is {_shown(pairs)}, not a list of [name, digest]")
    if "input" in value:
        digested = value["input"]
        if (
            not isinstance(digested, list)
            or not 1 <= len(digested) <= 2
            or not all(_text(d) for d in digested)
        ):
            raise _refusal(where, f"{prefix}input", f"is {_shown(digested)}, not [digest, digest version]")
    if "layout" in value:
        _object(value["layout"], where, f"{prefix}layout", required=("window_rows",))
        rows = value["layout"]["window_rows"]
        if not _count(rows) or rows < 1:
            raise _refusal(where, f"{prefix}layout.window_rows", f"is {_shown(rows)}, not a positive integer")
    if "failed" in value:
        failed = value["failed"]
        if (
            not isinstance(failed, list)
            or len(failed) != 2
            or not all(map(_count, failed))
            or failed[0] > failed[1]
        ):
            raise _refusal(where, f"{prefix}failed", f"is {_shown(failed)}, not [failed items, items]")
    return value


def _object(
    value: object, where: str, field: str, required: tuple = (), allowed: tuple | None = None
) -> None:
    """A JSON object with string keys: the required ones present, none beyond `allowed` (required, if given)."""
    if not isinstance(value, dict):
        raise _refusal(where, field, f"is {_shown(value)}, not an object")
    dotted = f"{field}." if field else ""
    for key in required:
        if key not in value:
            raise _refusal(where, f"{dotted}{key}", "is missing")
    allowed = allowed if allowed is not None else required or None
    extra = sorted(key for key in value if allowed is not None and key not in allowed)
    if extra:
        raise _refusal(where, f"{dotted}{extra[0]}", "is not a field of a completion record")


def _size_and_time(value: object, where: str, field: str) -> None:
    """[size, mtime in ns] of a published file."""
    if not isinstance(value, list) or len(value) != 2 or not all(map(_count, value)):
        raise _refusal(where, field, f"is {_shown(value)}, not [size, modification time]")


def _name_pair(pair: object, version: bool) -> bool:
    """[name, digest] (software: [name, version or null])."""
    return (
        isinstance(pair, list)
        and len(pair) == 2
        and _text(pair[0])
        and (_text(pair[1]) or (version and pair[1] is None))
    )


def _text(value: object) -> bool:
    return isinstance(value, str)


def _count(value: object) -> bool:
    """A non-negative integer (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: object) -> str:
    """A value as the message shows it: JSON, cut at 40 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _refusal(where: str, field: str, what: str) -> InputError:
    return InputError(
        f"the completion record {where}: field {field or '(the whole record)'!r} {what}; {REMEDY}"
    )
