"""Find and kill the processes a test started, by PID, when killing the launcher is not enough.

`procs.run` kills the launcher's process group, but launchers put their workers elsewhere:
OpenMPI gives every rank its own process group, and torchrun starts every worker in a new session
(start_new_session=True in torch.distributed.elastic). A killed launcher leaves those behind as
orphans, so tests sweep them by something only they carry: an argument (the test's tmp dir) or
the private network namespace they run in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

_PROC = Path("/proc")


def _pids(match: Callable[[int], bool]) -> list[int]:
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if match(int(entry.name)):
                found.append(int(entry.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # exited while we looked, or not ours to inspect
    return found


def pids_with_path_argument(path: Path) -> list[int]:
    """Live processes with `path`, or a path inside it, as one of their arguments."""
    inside = f"{path}/".encode()

    def match(pid: int) -> bool:
        args = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        return any(arg == bytes(path) or arg.startswith(inside) for arg in args)

    return _pids(match)


def pids_in_netns(netns: Path) -> list[int]:
    """Live processes inside the network namespace bound at `netns` (/run/netns/NAME)."""
    if not netns.exists():
        return []
    inode = netns.stat().st_ino
    return _pids(lambda pid: (_PROC / str(pid) / "ns" / "net").stat().st_ino == inode)


def descendants(root: int) -> list[int]:
    """Every live descendant of `root` (children that moved to their own session included)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def is_alive(pid: int) -> bool:
    """False once the process is gone or a zombie (dead, only waiting for its parent's wait)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:  # gone (or, on a foreign /proc, not ours to read: gone for our purpose)
        return False
    # The state letter follows the command name, which is in parentheses and may contain spaces.
    return stat.rpartition(")")[2].split()[0] != "Z"


def kill_and_wait(pids: list[int], *, timeout: float = 10.0) -> None:
    """SIGKILL each PID, then poll until all are dead; fail if one survives the deadline."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while (alive := [pid for pid in pids if is_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition with a deadline, not waiting for an event
    assert not alive, f"processes {alive} survived SIGKILL for {timeout}s"
