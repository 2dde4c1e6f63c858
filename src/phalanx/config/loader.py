"""Config sources, merged in order of precedence: defaults < YAML file < CLI overrides."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from phalanx.config.coerce import build, suggest, to_plain
from phalanx.errors import UsageError

T = TypeVar("T")
_KEY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML file's top-level mapping, with one-line errors for missing or malformed files."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file '{path}' not found; check the path given to --config")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:  # unreadable, or not text (a model.pt)
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        message = f"config file '{path}' cannot be read ({reason}); give a YAML file"
        raise UsageError(message) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise UsageError(f"config file '{path}'{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file '{path}' must hold a mapping of sections, not a list/value")
    return data


def parse_override(token: str, cls: type) -> tuple[list[str], str]:
    """'train.lr=3e-4' -> (['train', 'lr'], '3e-4'); the value stays text until typed."""
    key, sep, value = token.partition("=")
    if not sep or not _KEY.match(key):
        raise UsageError(
            f"override {token!r} is not KEY=VALUE with a dotted key (e.g. dist.timeout_s=120)"
        )
    if "." not in key:
        raise UsageError(f"override {token!r} names no section{suggest(key, cls)}")
    return key.split("."), value


def merge(base: Mapping[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `base` with the nested key `path` set to `value`."""
    out = dict(base)
    head = path[0]
    if len(path) == 1:
        out[head] = value
        return out
    below = out.get(head)
    if below is not None and not isinstance(below, Mapping):
        raise UsageError(f"config '{head}' is a value, so '{'.'.join(path)}' cannot be set")
    out[head] = merge(below or {}, path[1:], value)
    return out


def load(cls: type[T], *, file: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Resolve a config of type `cls` from an optional YAML file and dotted overrides."""
    data: dict[str, Any] = read_yaml(file) if file is not None else {}
    for token in overrides:
        path, value = parse_override(token, cls)
        data = merge(data, path, value)
    return build(cls, data)


def dump(config: Any) -> str:
    """The YAML text of a resolved config (what config.yaml in the run directory holds)."""
    return str(yaml.safe_dump(to_plain(config), sort_keys=False, default_flow_style=False))
