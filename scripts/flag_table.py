"""docs/flags.md's flag table: `score --help`'s options (cli/options.py's OPTIONS, shown by cli/help.py's
rules), each with its environment variable; tests/test_cli_options.py keeps the doc equal to it.

    python scripts/flag_table.py            # print the table (score_batch importable: pip install -e .)
    python scripts/flag_table.py --write    # rewrite it in docs/flags.md, between its two markers
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.core import TyperArgument

from score_batch.cli.app import app
from score_batch.cli.help import _default, _flags, _metavar
from score_batch.cli.options import ENV_PREFIX, OPTION, PANELS

DOC = Path(__file__).resolve().parents[1] / "docs" / "flags.md"
BEGIN = "<!-- flag table: made by scripts/flag_table.py from cli/options.py; do not edit by hand -->"
END = "<!-- end of the flag table -->"


def table() -> str:
    """One table per --help panel, in --help's order: flags and value, environment variable, the key a scoring
    profile gives it by (a ScoringConfig field's name), default, help."""
    command = typer.main.get_command(app).commands["score"]
    ctx = command.context_class(command, info_name="score", auto_envvar_prefix=ENV_PREFIX)
    lines = []
    for panel in PANELS:
        lines += ["", f"**{panel.replace(chr(92), '')}**", ""]
        lines += ["| flag | variable | profile key | default | what it does |", "|---|---|---|---|---|"]
        for param in (p for p in command.get_params(ctx) if getattr(p, "rich_help_panel", None) == panel):
            first, *others = _flags(param)
            flags = " / ".join(f"`{name}`" for name in (f"{first} {_metavar(param, ctx)}".strip(), *others))
            # click reads no variable for an argument
            variable = "" if isinstance(param, TyperArgument) else f"`{ENV_PREFIX}_{param.name.upper()}`"
            default = _default(param, ctx)  # a value as code, a default in words as words
            default = f"`{default}`" if default and not isinstance(param.show_default, str) else default
            setting = OPTION[param.name].setting or ""
            key = f"`{setting.partition('.')[2]}`" if setting.startswith("ScoringConfig.") else ""
            cells = (flags, variable, key, default, " ".join(param.help.split()))
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join([BEGIN, *lines, "", END])


if __name__ == "__main__":
    made = table()
    if sys.argv[1:] == ["--write"]:
        text = DOC.read_text(encoding="utf-8")
        before, _, rest = text.partition(BEGIN)
        DOC.write_text(before + made + rest.partition(END)[2], encoding="utf-8")
    else:
        print(made)
