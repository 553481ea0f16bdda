"""The `score` and `run-batch` --help: the options in titled panels (cli/options.py's PANELS, in that order),
drawn in the top-level help's style (Typer's rich panels and colours) at any terminal width, with every flag
name whole: a panel is a two-column table whose first column is as wide as its longest flag, and a value's
metavar that would not fit beside its flag goes on the line below it.

Typer's own panels give each of the flag, short flag, --no- flag and type its own column and cut them to fit
(at 80 columns --delimiter-token-id, --max-query-tokens, --no-apply-softmax and --trust-remote-code end in …):
rich narrows the widest columns first, so once help and type are down to the flag's width the flags go too.
In Model & scoring and Engine the flag columns and their gaps take 45 and 39 of the panel's 76 columns, which
leaves room for no metavar over 9 (16) characters, so no setting of Typer's keeps their choices and whole
flags; these panels are drawn here. Imported only when help is shown (rich stays out of a run's start-up).
"""

from __future__ import annotations

from rich.align import Align
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer import rich_utils
from typer.core import TyperArgument

OTHER = "Options"  # the panel of what names none (-h/--help), drawn last


def print_help(command, ctx, panels: tuple[str, ...]) -> None:
    """Usage line, description, then one panel per title of panels that holds a parameter (then any other)."""
    console = rich_utils._get_rich_console()
    console.print(
        Padding(rich_utils.highlighter(command.get_usage(ctx)), 1), style=rich_utils.STYLE_USAGE_COMMAND
    )
    if command.help:
        described = rich_utils._get_help_text(obj=command, markup_mode=rich_utils.MARKUP_MODE_RICH)
        console.print(Padding(Align(described, pad=False), (0, 1, 1, 1)))
    grouped: dict[str, list] = {}
    for param in command.get_params(ctx):
        if not getattr(param, "hidden", False):
            grouped.setdefault(getattr(param, "rich_help_panel", None) or OTHER, []).append(param)
    order = [title for title in panels if title in grouped] + [t for t in grouped if t not in panels]
    column = _column([param for params in grouped.values() for param in params], ctx, console.width)
    for title in order:
        console.print(
            Panel(
                _table(grouped[title], ctx, column),
                border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER,
                title=title,
                title_align=rich_utils.ALIGN_OPTIONS_PANEL,
            )
        )


def _column(params: list, ctx, width: int) -> int:
    """The first column's width, the same in every panel: the longest flag, and a flag with its metavar (or a
    metavar on its own line) up to two fifths of the panel, at most 42 columns."""
    rows = [(_flags(param), _metavar(param, ctx)) for param in params]
    flags_width = max(len(line) for flags, _ in rows for line in flags)
    fits = max(flags_width, min(42, (width - 6) * 2 // 5))
    wanted = [flags_width]
    for flags, metavar in rows:
        if metavar:
            beside = len(flags[0]) + 1 + len(metavar)
            wanted.append(beside if beside <= fits else min(fits, 2 + len(metavar)))
    return max(wanted)


def _table(params: list, ctx, column: int) -> Table:
    """Flags (and metavars) | help, [default: …] and [required] below it."""
    table = Table(box=None, show_header=False, expand=True, padding=(0, 1), pad_edge=False)
    table.add_column(width=column, overflow="fold")
    table.add_column(ratio=1)
    for param in params:
        table.add_row(_names(_flags(param), _metavar(param, ctx), column), _described(param, ctx))
    return table


def _flags(param) -> list[str]:
    """The parameter's names, a line each: the short and long flags, then the --no- form (an argument: its
    metavar, INPUT...)."""
    if isinstance(param, TyperArgument):
        return [param.display_name_raw]
    return [", ".join(sorted(param.opts, key=lambda name: name.startswith("--"))), *param.secondary_opts]


def _metavar(param, ctx) -> str:
    """What a value looks like (cli/command.HelpOption's rules); '' for a flag or an argument."""
    return param.display_type_rich(ctx) or ""


def _names(flags: list[str], metavar: str, column: int) -> Text:
    """The first column: the flags, each whole, the metavar beside the first one or on the line below."""
    text = Text()
    for number, line in enumerate(flags):
        if number:
            text.append("\n")
        style = rich_utils.STYLE_OPTION if number == 0 else rich_utils.STYLE_NEGATIVE_OPTION
        text.append(line, style=style)
        if number == 0 and metavar:
            beside = len(line) + 1 + len(metavar) <= column
            shown = " " + metavar if beside else "\n  " + "\n  ".join(_wrapped(metavar, column - 2))
            text.append(shown, style=rich_utils.STYLE_TYPES)
    return text


def _wrapped(metavar: str, width: int) -> list[str]:
    """A metavar in lines of at most width, broken after a | where it must be: [error|item-tail|…]."""
    lines = [""]
    for piece in metavar.replace("|", "|\n").split("\n"):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines


def _described(param, ctx) -> Text:
    """The help text (rich markup), then [default: …] as every default is shown, and [required]."""
    text = Text.from_markup(" ".join((param.help or "").split()), style=rich_utils.STYLE_OPTION_HELP)
    default = _default(param, ctx)
    if default:
        text.append("\n" + rich_utils.DEFAULT_STRING.format(default), style=rich_utils.STYLE_OPTION_DEFAULT)
    if param.required:
        text.append("\n" + rich_utils.REQUIRED_LONG_STRING, style=rich_utils.STYLE_REQUIRED_LONG)
    return text


def _default(param, ctx) -> str:
    """The default as Typer's panels show it ('' for none shown): a value, or the words of show_default."""
    if isinstance(param, TyperArgument) or getattr(param, "is_flag", False) and not param.secondary_opts:
        return ""  # a flag is off unless given
    value = param._extract_default_help_str(ctx=ctx)
    if param.secondary_opts and isinstance(value, bool):  # --pipeline/--no-pipeline: the flag it means
        return param.opts[-1] if value else param.secondary_opts[0]
    if isinstance(param.show_default, str):  # a default in words, shown as they are
        return param.show_default
    if value is None or not (param.show_default or ctx.show_default):
        return ""
    return param._get_default_string(ctx=ctx, show_default_is_str=False, default_value=value)
