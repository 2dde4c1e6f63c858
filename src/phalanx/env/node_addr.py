"""An address for rank 0's SLURM node that the other nodes can reach.

SLURM knows nodes by `NodeName`; where those names are not in DNS or /etc/hosts (cloud bursting,
containers, two slurmd on one host) it reaches them through `NodeAddr`. Rendezvous at an
unresolvable name waits for the whole timeout with nothing but c10d's IPv6 warnings, so the
name is checked here, before any rendezvous, and replaced by SLURM's `NodeAddr` when needed.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable

from phalanx.errors import UsageError

NodeAddr = Callable[[str], str]
"""Maps a SLURM node name to the address other nodes reach it at (raises UsageError)."""

SCONTROL_TIMEOUT_S = 10.0
"""scontrol retries an unreachable slurmctld for a minute; the start of a run must not."""

_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=(\S+)")


def resolves(host: str) -> bool:
    """True when this machine can turn `host` into an address (DNS, /etc/hosts, a literal IP)."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def scontrol_show_node(name: str) -> str:
    """`scontrol show node -o NAME`; raises LookupError with the reason when SLURM cannot say."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "node", "-o", name],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise LookupError("scontrol is not on PATH") from None
    except subprocess.TimeoutExpired:
        raise LookupError(f"scontrol gave no answer within {SCONTROL_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise LookupError(f"scontrol failed: {reason}")
    return done.stdout


def node_address(
    name: str,
    *,
    can_resolve: Callable[[str], bool] = resolves,
    show_node: Callable[[str], str] = scontrol_show_node,
) -> str:
    """`name` when it resolves, else SLURM's NodeAddr for it when that resolves.

    Otherwise a one-line UsageError naming the node and the fix: a run that cannot reach rank 0
    should stop now, not after the rendezvous timeout.
    """
    if can_resolve(name):
        return name
    try:
        found = _NODE_ADDR.search(show_node(name))
    except LookupError as error:
        reason = str(error)
    else:
        addr = found.group(1) if found else ""
        if addr and addr != name and can_resolve(addr):
            return addr
        reason = f"its NodeAddr {addr!r} does not resolve either" if addr else "no NodeAddr"
    raise UsageError(
        f"rank 0's node {name!r} does not resolve here (DNS, /etc/hosts) and SLURM gives no "
        f"usable address for it ({reason}); export MASTER_ADDR=<address of {name}> before srun"
    )
