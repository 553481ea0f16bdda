"""docs/flags.md's flag table, derived from cli/options.py's OPTIONS (tests/test_cli_options.py keeps them equal).

    python scripts/flag_table.py            # print the table (score_batch importable: pip install -e .)
    python scripts/flag_table.py --write    # rewrite it in docs/flags.md, between its two markers
"""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path

from score_batch.cli.options import OPTIONS, PANELS, Option

DOC = Path(__file__).resolve().parents[1] / "docs" / "flags.md"
BEGIN = "<!-- flag table: made by scripts/flag_table.py from cli/options.py; do not edit by hand -->"
END = "<!-- end of the flag table -->"
TYPE_WORDS = {str: "TEXT", int: "INTEGER", float: "FLOAT"}


def table() -> str:
    """One table per --help panel, in --help's order: flags and value, environment variable, default, help."""
    lines = []
    for panel in PANELS:
        lines += ["", f"**{panel.replace(chr(92), '')}**", "", "| flag | variable | default | what it does |"]
        lines.append("|---|---|---|---|")
        for option in (o for o in OPTIONS if o.panel == panel):
            flags = [*(f for decl in option.flags for f in decl.split("/") if not f.startswith("--"))]
            flags = ", ".join(f"`{f}`" for f in (*flags, f"{option.flag} {_value(option)}".strip()))
            off = f" / `{option.off}`" if option.off else ""
            variable = "" if option.argument else f"`{option.env}`"  # click reads no variable for an argument
            cells = (flags + off, variable, _default(option), option.help)
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([BEGIN, *lines, "", END])


def _value(option: Option) -> str:
    """What a value looks like, as --help shows it ('' for a flag or the argument)."""
    kinds = [t for t in (option.type, *typing.get_args(option.type)) if t is not type(None)]
    if option.argument or bool in kinds:
        return ""
    if option.metavar:
        return option.metavar
    literal = next((t for t in kinds if typing.get_origin(t) is typing.Literal), None)
    if literal is not None:
        return "|".join(typing.get_args(literal))
    return next(TYPE_WORDS[t] for t in kinds if t in TYPE_WORDS)


def _default(option: Option) -> str:
    """The default as --help says it; '' where it shows none (a flag is off unless given)."""
    if isinstance(option.shown, str):
        return option.shown
    if option.off and isinstance(option.default, bool):
        return f"`{option.flag if option.default else option.off}`"
    if option.default in (None, False, inspect.Parameter.empty) or not option.shown:
        return ""
    return f"`{option.default}`"


if __name__ == "__main__":
    made = table()
    if sys.argv[1:] == ["--write"]:
        text = DOC.read_text(encoding="utf-8")
        before, _, rest = text.partition(BEGIN)
        DOC.write_text(before + made + rest.partition(END)[2], encoding="utf-8")
    else:
        print(made)
