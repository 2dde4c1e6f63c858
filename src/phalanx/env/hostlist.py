"""SLURM's compressed host lists and task counts, parsed without calling `scontrol`.

`scontrol show hostnames` needs the SLURM binaries on the node; compute nodes inside containers
often lack them, so phalanx expands the forms itself (tests compare against the real scontrol).
"""

from __future__ import annotations

import re

from phalanx.errors import UsageError

MAX_HOSTS = 65536
"""SLURM's own limit on the hosts of one list; a typo such as n[1-9999999999] stops here."""
_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x([1-9]\d*)\))?$")


def _split_top_level(text: str, separators: str = ",") -> list[str]:
    """Split on separators that are not inside brackets: 'a[1,3],b2' -> ['a[1,3]', 'b2']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"host list {text!r} has an unmatched ']'")
        elif ch in separators and depth == 0:
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
    if int(hi) - int(lo) >= MAX_HOSTS:
        raise UsageError(f"host list {text!r}: range {item!r} exceeds SLURM's {MAX_HOSTS} hosts")
    width = len(lo) if lo.startswith("0") else 0
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]


def _expand_body(body: str, text: str) -> list[str]:
    """'1-2,7' -> ['1', '2', '7']."""
    if not body:
        raise UsageError(f"host list {text!r} has an empty range '[]'")
    return [value for item in body.split(",") for value in _expand_range(item, text)]


def _expand_one(host: str, text: str) -> list[str]:
    """Expand one separator-free pattern; several bracket groups form a cartesian product.

    The order is scontrol's: the last group varies fastest and the groups before it are outer
    loops taken from the right ('a[1-2]b[1-2]c[1-2]' -> a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...).
    """
    close_at = host.rfind("]")
    if close_at < 0:
        return [host]
    open_at = host.rindex("[", 0, close_at)
    suffix = host[close_at + 1 :]
    tails = [value + suffix for value in _expand_body(host[open_at + 1 : close_at], text)]
    return _expand_prefix(host[:open_at], tails, text)


def _expand_prefix(prefix: str, tails: list[str], text: str) -> list[str]:
    """Each bracket group of `prefix`, from the right, is an outer loop around `tails`."""
    close_at = prefix.rfind("]")
    if close_at < 0:
        return [prefix + tail for tail in tails]
    open_at = prefix.rindex("[", 0, close_at)
    middle = prefix[close_at + 1 :]
    return [
        host
        for value in _expand_body(prefix[open_at + 1 : close_at], text)
        for host in _expand_prefix(prefix[:open_at], [value + middle + t for t in tails], text)
    ]


def expand_hostlist(text: str) -> list[str]:
    """Expand a SLURM host list such as ``node[001-003,010],gpu7`` into host names, in order."""
    text = text.strip()
    if not text:
        raise UsageError("host list is empty; expected e.g. 'node[01-04]'")
    hosts: list[str] = []
    for part in _split_top_level(text):
        if not part.strip():
            raise UsageError(f"host list {text!r} has an empty entry between commas")
        # SLURM separates entries by whitespace too ('n[1-2], m3' is n1 n2 m3).
        for word in _split_top_level(part, " \t\n"):
            if word:
                hosts.extend(_expand_one(word, text))
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
