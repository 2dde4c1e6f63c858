"""Per-field docstrings of config dataclasses, read from the source, for `--help`."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types
import typing
from typing import Any

from phalanx.config.coerce import section_default


def field_docs(cls: type) -> dict[str, str]:
    """{field name: the string literal right below its annotation}, base classes included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue  # defined interactively: no source, no docs
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "|".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return "|".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def help_lines(cls: type, prefix: str = "", default: Any = None) -> list[str]:
    """One line per key: `section.key (type, default X)  doc`, sections as headings.

    Defaults come from the parent's default instance where a section is built by a factory.
    """
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    lines: list[str] = []
    for field in dataclasses.fields(cls):
        tp, key = hints[field.name], f"{prefix}{field.name}"
        value = section_default(field, default)
        if dataclasses.is_dataclass(tp):
            lines.append(f"{key}: {docs.get(field.name, '')}".rstrip())
            lines += help_lines(tp, f"{key}.", value)  # type: ignore[arg-type]
            continue
        shown = "(required)" if value is None and field.default is dataclasses.MISSING else value
        lines.append(f"  {key} ({_type_name(tp)}, default {shown!r})  {docs.get(field.name, '')}")
    return lines
