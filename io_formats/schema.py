"""Column layouts of input tables: detection from column names, overrides, and clear errors."""

from __future__ import annotations

from dataclasses import dataclass

from score_batch.io_formats.errors import InputError

ITEM_NAMES = ("item", "item_tokens")  # the long layout's item column, found by name


@dataclass(frozen=True)
class ColumnOverrides:
    """Column names the user gave on the command line (None = detect)."""

    query_col: str | None = None
    item_col: str | None = None
    items_col: str | None = None
    query_id_col: str | None = None  # one column, or several comma-separated (a composite key)
    item_id_col: str | None = None
    keep_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class ColumnMapping:
    """Which input columns hold the query, the item(s), the ids and the pass-through values."""

    layout: str  # "long": one item per row; "nested": a list of items per row
    query: str
    items: str  # the item column (long) or the items list column (nested)
    query_id: str | None
    item_id: str | None  # item id column (long) or item ids list column (nested)
    keep: tuple[str, ...]
    query_key: tuple[str, ...] = ()  # a composite query id (several columns; query_id is then None)

    @property
    def id_columns(self) -> tuple[str, ...]:
        """The columns that identify a query: the composite key, the query-id column, or none."""
        return self.query_key or ((self.query_id,) if self.query_id else ())

    def typed_columns(self) -> list[str]:
        """The columns whose values reach the output: ids (each key column) and kept columns."""
        names = [*self.id_columns, self.item_id, *self.keep]
        return list(dict.fromkeys(name for name in names if name is not None))

    def read_columns(self) -> list[str]:
        """Every column a run reads: the query, the item(s), then typed_columns()."""
        return list(dict.fromkeys((self.query, self.items, *self.typed_columns())))


def resolve_columns(columns: list[str] | None, overrides: ColumnOverrides, source: str) -> ColumnMapping:
    """Detect the layout from column names (long, nested, token ids) and apply the user's overrides (columns
    None, an input without a row: the overrides as given, the usual names for the rest)."""
    if columns is None:
        return _empty_input_mapping(overrides)
    present = set(columns)

    def pick(override: str | None, candidates: tuple[str, ...], flag: str, required: bool) -> str | None:
        if override is not None:
            if override not in present:
                raise InputError(
                    f"{source}: column {override!r} (given with {flag}) is not in the input; columns: "
                    f"{_list(columns)}"
                )
            return override
        for name in candidates:
            if name in present:
                return name
        if required:  # the query column, or the items column once no item column was found
            what = "query" if flag == "--query-col" else "item"
            looked = ITEM_NAMES + candidates if what == "item" else candidates
            flags = (
                "--item-col (one item per row) or --items-col (a list per row)" if what == "item" else flag
            )
            raise InputError(
                f"{source}: no {what} column (looked for {_list(looked)}); name it with {flags}; "
                f"columns: {_list(columns)}"
            )
        return None

    query = pick(overrides.query_col, ("query", "query_tokens"), "--query-col", True)
    item = (
        None if overrides.items_col is not None else pick(overrides.item_col, ITEM_NAMES, "--item-col", False)
    )
    long = item is not None
    items = item if long else pick(overrides.items_col, ("items", "items_tokens"), "--items-col", True)
    item_id = pick(overrides.item_id_col, ("item_id",) if long else ("item_ids",), "--item-id-col", False)
    key = id_key(overrides.query_id_col, present)
    composite = key if len(key) > 1 else ()
    query_id = None if composite else pick(key[0] if key else None, ("query_id",), "--query-id-col", False)
    for column in composite:
        pick(column, (), "--query-id-col", True)
    for name in overrides.keep_columns:
        if name not in present:
            raise InputError(
                f"{source}: --keep-columns names {name!r}, which is not in the input; columns: {_list(columns)}"
            )
    _check_keep(overrides.keep_columns, query_id, item_id)
    keep = tuple(overrides.keep_columns)
    return ColumnMapping("long" if long else "nested", query, items, query_id, item_id, keep, composite)


def id_key(query_id_col: str | None, present: set[str] | None = None) -> tuple[str, ...]:
    """--query-id-col as its columns: one name (also one holding a comma, when the input has it), or several
    comma-separated (a composite key), each once."""
    if query_id_col is None:
        return ()
    if present is not None and query_id_col in present or "," not in query_id_col:
        return (query_id_col,)
    names = tuple(name.strip() for name in query_id_col.split(",") if name.strip())
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:
        raise InputError(f"--query-id-col names {twice!r} twice")
    if not names:
        raise InputError(f"--query-id-col {query_id_col!r} names no column")
    return names


def _check_keep(keep: tuple[str, ...], query_id: str | None, item_id: str | None) -> None:
    """Kept columns must be new output columns: not an id column, not twice (the names the job writes itself
    are refused by job.contract.check_kept_columns)."""
    seen: set[str] = set()
    for name in keep:
        if name in seen:
            raise InputError(f"--keep-columns names {name!r} twice")
        seen.add(name)
        for column, output in ((query_id, "query_id"), (item_id, "item_id")):
            if name == column:
                raise InputError(
                    f"--keep-columns: {name!r} is already in the output as {output}; leave it out"
                )


def _empty_input_mapping(overrides: ColumnOverrides) -> ColumnMapping:
    """The mapping of an input with no rows: the overrides, else the long layout's usual names."""
    query = overrides.query_col or "query"
    nested = overrides.items_col is not None and overrides.item_col is None
    items = overrides.items_col if nested else (overrides.item_col or "item")
    key = id_key(overrides.query_id_col)
    ids = (key[0] if len(key) == 1 else None, overrides.item_id_col)
    keep = tuple(overrides.keep_columns)
    _check_keep(keep, *ids)
    return ColumnMapping(
        "nested" if nested else "long", query, items, *ids, keep, key if len(key) > 1 else ()
    )


def _list(names) -> str:
    """Names as a short comma-separated list."""
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:20])
    return shown + (f", … ({len(names)} in all)" if len(names) > 20 else "")
