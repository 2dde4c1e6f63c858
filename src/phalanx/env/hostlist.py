"""SLURM's compressed host lists and task counts, parsed without calling `scontrol`.

`scontrol show hostnames` needs the SLURM binaries on the node; compute nodes inside containers
often lack them, so phalanx expands the forms itself (tests compare against the real scontrol).
"""

from __future__ import annotations

import re

from phalanx.errors import UsageError

_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: 'a[1,3],b2' -> ['a[1,3]', 'b2']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"host list {text!r} has an unmatched ']'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise UsageError(f"host list {text!r} has an unmatched '['")
    parts.append(text[start:])
    return parts


def _expand_range(item: str, text: str) -> list[str]:
    """'001-003' -> ['001', '002', '003'] keeping the zero padding of the lower bound."""
    lo, sep, hi = item.partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise UsageError(f"host list {text!r}: range {item!r} is not 'N' or 'N-M'")
    if not sep:
        return [lo]
    if int(hi) < int(lo):
        raise UsageError(f"host list {text!r}: range {item!r} goes downwards")
    width = len(lo) if lo.startswith("0") else 0
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]


def _expand_one(host: str, text: str) -> list[str]:
    """Expand one comma-free pattern; several bracket groups form a cartesian product."""
    open_at = host.find("[")
    if open_at < 0:
        return [host]
    close_at = host.index("]", open_at)
    prefix, body, rest = host[:open_at], host[open_at + 1 : close_at], host[close_at + 1 :]
    if not body:
        raise UsageError(f"host list {text!r} has an empty range '[]'")
    suffixes = _expand_one(rest, text)
    return [
        prefix + value + suffix
        for item in body.split(",")
        for value in _expand_range(item, text)
        for suffix in suffixes
    ]


def expand_hostlist(text: str) -> list[str]:
    """Expand a SLURM host list such as ``node[001-003,010],gpu7`` into host names, in order."""
    text = text.strip()
    if not text:
        raise UsageError("host list is empty; expected e.g. 'node[01-04]'")
    hosts: list[str] = []
    for part in _split_top_level(text):
        if not part:
            raise UsageError(f"host list {text!r} has an empty entry between commas")
        hosts.extend(_expand_one(part, text))
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand SLURM's task counts such as ``2(x3),1`` into ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            raise UsageError(
                f"tasks per node {text!r}: {item!r} is not 'N' or 'N(xM)' as SLURM writes it"
            )
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        counts.extend([count] * repeat)
    return counts
