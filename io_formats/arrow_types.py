"""Arrow types that hold the values of several files or lines without loss."""

from __future__ import annotations

import pyarrow as pa


def unify(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds the values of both a and b without loss, or None."""
    if a == b:
        return a
    try:
        merged = (
            pa.unify_schemas([pa.schema([("c", a)]), pa.schema([("c", b)])], promote_options="permissive")
            .field("c")
            .type
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return merged if _holds(merged, a) and _holds(merged, b) else None


def _holds(wide: pa.DataType, narrow: pa.DataType) -> bool:
    """Whether every integer value of narrow fits in wide (other promotions are trusted to pyarrow)."""
    if not (pa.types.is_integer(wide) and pa.types.is_integer(narrow)):
        return True
    if pa.types.is_signed_integer(narrow):
        return pa.types.is_signed_integer(wide) and wide.bit_width >= narrow.bit_width
    return wide.bit_width > narrow.bit_width or (
        pa.types.is_unsigned_integer(wide) and wide.bit_width == narrow.bit_width
    )
