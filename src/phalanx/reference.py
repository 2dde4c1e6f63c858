"""Reference pages of the docs site, rendered from the code itself so they cannot drift: the CLI
(from `phalanx.cli.build_parser`), the config keys (from the config dataclasses and their field
docstrings, as `--help` shows them) and the API (from `phalanx.__all__`).

Called by the MkDocs hook `docs/_hooks/generate.py`; `python -m phalanx.reference cli` prints a
page for a quick look.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import typing
from collections.abc import Iterator
from typing import Any

from phalanx.config.coerce import section_default
from phalanx.config.docs import field_docs

# A fixed width: the page must not depend on the terminal that built it.
_WIDTH = 96


def _cell(text: object) -> str:
    # Config docs write placeholders as <root>; unescaped, Markdown would take them for HTML
    # (inside a `code span` it shows them as written, so those parts stay as they are).
    parts = str(text).replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| option | value | default | meaning |", "| --- | --- | --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
        takes_value = action.nargs != 0
        value = (action.metavar or action.dest.upper()) if takes_value else ""
        shown = action.default
        default = "" if shown in (None, "", argparse.SUPPRESS, False) else f"`{shown}`"
        rows.append(f"| {flags} | {_cell(value)} | {_cell(default)} | {_cell(action.help or '')} |")
    return rows


def cli_page() -> str:
    """Markdown: every `phalanx` subcommand with its usage line and options table."""
    from phalanx.cli import build_parser  # the parser module imports the job commands

    parser = build_parser()
    lines = [
        "# CLI reference",
        "",
        "Generated from `phalanx.cli.build_parser` when the site is built; `phalanx COMMAND "
        "--help` prints the same. `tests/pure/test_cli_surface.py` pins the options.",
        "",
    ]
    for name, summary, sub in _subcommands(parser):
        sub.formatter_class = functools.partial(argparse.HelpFormatter, width=_WIDTH)
        about = " ".join((sub.description or summary).split())
        lines += [f"## `phalanx {name}`", "", about[:1].upper() + about[1:], ""]
        lines += ["```text", sub.format_usage().strip(), "```", ""]
        lines += [*_options_table(sub), ""]
    return "\n".join(lines)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " \\| ".join(map(str, typing.get_args(tp)))
    return _cell(getattr(tp, "__name__", None) or str(tp).replace("typing.", ""))


def _config_rows(cls: type, prefix: str, default: Any) -> Iterator[tuple[str, list[str]]]:
    """(section key, its table rows) for `cls` and every nested section, depth first."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    rows: list[str] = []
    nested: list[tuple[str, Any, Any]] = []
    for field in dataclasses.fields(cls):
        tp, value = hints[field.name], section_default(field, default)
        if dataclasses.is_dataclass(tp):
            nested.append((f"{prefix}{field.name}", tp, value))
            continue
        shown = "required" if value is None and field.default is dataclasses.MISSING else value
        doc = _cell(docs.get(field.name, ""))
        rows.append(f"| `{prefix}{field.name}` | {_type_name(tp)} | `{shown!r}` | {doc} |")
    if rows:
        yield prefix.rstrip("."), rows
    for key, tp, value in nested:
        yield from _config_rows(tp, f"{key}.", value)


def config_page() -> str:
    """Markdown: every key of `phalanx.TrainerConfig`, one table per section."""
    from phalanx.config.training import TrainerConfig

    lines = [
        "# Config reference",
        "",
        "Every key of `phalanx.TrainerConfig`, generated from the config dataclasses and their "
        "field docstrings (what `python train.py --help` prints). Set one as `section.key=value` "
        "on the command line or in the YAML file of `--config` "
        "(see [Configuration](../config.md)).",
        "",
    ]
    for section, rows in _config_rows(TrainerConfig, "", None):
        header = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        lines += [f"## `{section}`", "", *header, *rows, ""]
    return "\n".join(lines)


def api_page() -> str:
    """Markdown with one mkdocstrings directive per export of `phalanx`, by defining module."""
    import phalanx

    lines = [
        "# API reference",
        "",
        "Everything below is importable from `phalanx` (`phalanx.Trainer`, `phalanx.wrap_model` "
        "…); generated from `phalanx.__all__` and the docstrings. `tests/pure/test_public_api.py` "
        "pins this list.",
        "",
    ]
    for name in sorted(n for n in phalanx.__all__ if not n.startswith("_")):
        module = getattr(phalanx, name).__module__
        lines += [f"::: {module}.{name}", "    options:", "      heading_level: 2", ""]
    return "\n".join(lines)


PAGES = {"cli": cli_page, "config": config_page, "api": api_page}


if __name__ == "__main__":
    page = sys.argv[1] if len(sys.argv) > 1 else ""
    if page not in PAGES:
        sys.exit(f"usage: python -m phalanx.reference {{{'|'.join(PAGES)}}}")
    print(PAGES[page]())
