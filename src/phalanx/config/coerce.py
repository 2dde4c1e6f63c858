"""Turn nested mappings (YAML, CLI overrides) into typed config dataclasses, or say what is wrong.

Every error is one line naming the dotted key, what was found and what is expected; an unknown
key comes with the closest valid key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union

from phalanx.errors import UsageError

T = TypeVar("T")
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of a config class, dotted: ['dist.backend', 'run.name', ...]."""
    hints = typing.get_type_hints(cls)
    keys: list[str] = []
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            keys += dotted_keys(tp, f"{prefix}{field.name}.")  # type: ignore[arg-type]
        else:
            keys.append(f"{prefix}{field.name}")
    return keys


def suggest(key: str, cls: type) -> str:
    """'; did you mean X?' for the closest valid dotted key (or leaf name), else ''."""
    valid = dotted_keys(cls)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if not close:
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in valid if k.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean '{close[0]}'?" if close else ""


def section_default(field: dataclasses.Field[Any], parent: Any = None) -> Any:
    """A field's default: taken from the parent's default instance when there is one, so that
    `train: Train = field(default_factory=lambda: Train(epochs=2))` keeps epochs=2."""
    if parent is not None:
        return getattr(parent, field.name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


def build(
    cls: type[T],
    data: Mapping[str, Any],
    *,
    default: Any = None,
    root: type | None = None,
    prefix: str = "",
) -> T:
    """Instantiate `cls` from `data` over `default` (or the class defaults), recursing into
    nested config sections."""
    root = root or cls
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        if name not in fields:
            raise UsageError(f"config key '{key}' is unknown{suggest(key, root)}")
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                raise UsageError(
                    f"config '{key}' is a section; give keys below it (e.g. {key}.KEY=VALUE), "
                    f"not {value!r}"
                )
            below = section_default(fields[name], default)
            kwargs[name] = build(tp, value, default=below, root=root, prefix=f"{key}.")  # type: ignore[arg-type]
        else:
            kwargs[name] = coerce(value, tp, key)
    if default is not None:
        return dataclasses.replace(default, **kwargs)  # type: ignore[no-any-return]
    for name, field in fields.items():
        if name in kwargs or not _required(field):
            continue
        if dataclasses.is_dataclass(hints[name]):  # a section: name its first required key
            kwargs[name] = build(hints[name], {}, root=root, prefix=f"{prefix}{name}.")
            continue
        raise UsageError(f"config '{prefix}{name}' is required; add {prefix}{name}=VALUE")
    return cls(**kwargs)


def _required(field: dataclasses.Field[Any]) -> bool:
    no_default = field.default is dataclasses.MISSING
    return no_default and field.default_factory is dataclasses.MISSING and field.init


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert a YAML value or a CLI string to type `tp`, or raise a one-line UsageError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if text not in args:
            raise UsageError(f"config {key}={value!r} is not one of: {', '.join(map(str, args))}")
        return text
    if origin in (Union, types.UnionType):
        empty = value is None or (isinstance(value, str) and value.lower() in ("null", "none", ""))
        if empty and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for option in inner:  # the first type that takes the value, in the declared order
            try:
                return coerce(value, option, key)
            except UsageError as error:
                errors.append(str(error))
        if len(errors) == 1:
            raise UsageError(errors[0])
        head = f"config {key}={value!r} "  # said once: "... is not an integer and is not ..."
        raise UsageError(head + " and ".join(e.removeprefix(head) for e in errors))
    if origin in (tuple, list):
        items = value if isinstance(value, (list, tuple)) else _split_list(value)
        return tuple(coerce(item, args[0], f"{key}[{i}]") for i, item in enumerate(items))
    if origin is dict:
        return _mapping(value, args, key)
    return _scalar(value, tp, key)


def _mapping(value: Any, args: tuple[Any, ...], key: str) -> dict[Any, Any]:
    """A YAML mapping, a CLI '{name: 1, other: 2}', or the keys below it (key.name=1)."""
    if isinstance(value, str):
        import yaml  # the loader's parser: '{a: 1}' reads as in a config file

        with contextlib.suppress(yaml.YAMLError):  # not YAML: refused below, as any non-mapping
            value = yaml.safe_load(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise UsageError(
            f"config {key}={value!r} is not a mapping; give {{name: value, ...}} or "
            f"{key}.NAME=VALUE"
        )
    return {
        coerce(k, args[0], f"{key} (a name)"): coerce(v, args[1], f"{key}.{k}")
        for k, v in value.items()
    }


def _split_list(value: Any) -> list[str]:
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [part.strip() for part in text.split(",") if part.strip()]


def _scalar(value: Any, tp: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise UsageError(f"config {key}={value!r} is not a boolean; use true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        raise UsageError(f"config {key}={value!r} is not an integer")
    if tp is float:
        if isinstance(value, bool):
            raise UsageError(f"config {key}={value!r} is not a number (e.g. 3e-4)")
        try:
            number = float(value if isinstance(value, (int, float)) else str(value).strip())
        except ValueError:
            raise UsageError(f"config {key}={value!r} is not a number (e.g. 3e-4)") from None
        if not math.isfinite(number):  # no setting means "unlimited" by inf; nan compares false
            raise UsageError(f"config {key}={value!r} must be a finite number")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise UsageError(f"config {key} expects text, got {value!r}")
        return str(value)
    raise AssertionError(f"config field {key} has unsupported type {tp!r}")


def to_plain(config: Any) -> dict[str, Any]:
    """Nested plain dicts/lists (YAML-safe) of a config dataclass."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))  # type: ignore[no-any-return]
