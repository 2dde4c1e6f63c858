"""A training script's command line: `[--config FILE] [section.key=value ...] [--help]`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from phalanx.config.docs import help_lines
from phalanx.config.loader import load
from phalanx.errors import UsageError

C = TypeVar("C")
RESOLVE_FLAG = "--phalanx-resolve"
"""Added by `phalanx run` to resolve the config and run directory once, before any worker."""


@dataclass(frozen=True)
class ParsedArgs(Generic[C]):
    config: C
    config_file: str | None
    resolve_only: bool


def wants_config(args: Sequence[str]) -> bool:
    """Do these script arguments use phalanx's config syntax (so `phalanx run` resolves them)?"""
    return any(a == "--config" or a.startswith("--config=") or _is_override(a) for a in args)


def _is_override(arg: str) -> bool:
    key, sep, _ = arg.partition("=")
    return bool(sep) and "." in key and not key.startswith("-")


def usage(cls: type, prog: str) -> str:
    header = (
        f"usage: {prog} [--config FILE] [section.key=VALUE ...]\n\n"
        "Precedence: defaults < --config FILE < overrides. Keys:\n"
    )
    return header + "\n".join(help_lines(cls))


def parse_args(cls: type[C], argv: Sequence[str] | None = None) -> ParsedArgs[C]:
    """Parse and validate; raises UsageError (one line) on bad input, SystemExit(0) on --help."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(usage(cls, sys.argv[0] if argv is None else "script.py"))
        raise SystemExit(0)
    config_file, overrides, resolve_only = None, [], False
    it = iter(args)
    for arg in it:
        if arg == RESOLVE_FLAG:
            resolve_only = True
        elif arg == "--config" or arg.startswith("--config="):
            if config_file is not None:
                raise UsageError("--config given twice; merge the files or pass one")
            value = arg.partition("=")[2] if "=" in arg else next(it, None)
            if not value:
                raise UsageError("--config needs a file name: --config FILE.yaml")
            config_file = value
        elif arg.startswith("-"):
            raise UsageError(
                f"unknown option {arg!r}; this script takes --config FILE and "
                "section.key=VALUE overrides (see --help)"
            )
        else:
            overrides.append(arg)
    config = load(cls, file=config_file, overrides=overrides)
    return ParsedArgs(config=config, config_file=config_file, resolve_only=resolve_only)
