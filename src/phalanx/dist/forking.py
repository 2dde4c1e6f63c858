"""How the processes of a run start children: through a fork server, never by forking a rank.

A rank runs threads from its first collective on (gloo's, the hang watch, DataLoader pin-memory
threads, a checkpoint writer). A child forked while one of them holds a lock inherits the lock
held and can wait on it forever. CPython 3.11 does exactly that when another thread creates or
deletes its thread state at the moment of fork: the child blocks on the interpreter's HEAD_LOCK
in `PyOS_AfterFork_Child` (python/cpython#112275; benchmarks/fork_stress.py reproduces it with
phalanx's Trainer). Python 3.14 made "forkserver" the default start method on Linux for this
reason; phalanx makes it the default of every rank now, so that users' own DataLoaders and pools
are safe too, unless the script chose a method itself.

The fork server is one single-threaded process; children fork from it. It must import what they
need once, or every child imports torch anew (1.7 s idle, ~5 s on a loaded 2-core machine, per
worker and start). Python 3.11 does not preload the main script there as documented (the server
asks for a 'main_path' key that multiprocessing.spawn never provides), so phalanx names the
modules the script imported.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import time
from types import ModuleType

from phalanx.errors import UsageError

log = logging.getLogger(__name__)

PREEMPTION_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
"""Left to the rank: the fork server and its workers ignore them (forkserver_child, which this
module must not import: importing it makes a process a fork server)."""


def script_modules() -> list[str]:
    """The modules the main script's names come from (its imported modules, and the modules of
    the classes and functions it imported by name), plus torch and phalanx.

    Whole dotted names, not only top-level packages: a child re-runs the script's imports to
    unpickle what the script defines, and `from mylib.models import Net` there costs each child
    that module's import (seconds for a model library's) unless the server imported it first."""
    names = {"torch", "phalanx"}
    main = sys.modules.get("__main__")
    for name, value in vars(main).items() if main is not None else ():
        if name.startswith("__"):
            continue  # __builtins__, __loader__ ...: the interpreter's, not the script's imports
        module = (
            value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", "")
        )
        if isinstance(module, str) and module and not module.startswith("__"):
            names.add(module)
    return sorted(name for name in names - {"builtins"} if name in sys.modules)


def preload_forkserver() -> None:
    """Have the fork server import the script's modules once (no effect once it runs)."""
    preload = ["__main__", *script_modules(), "phalanx.dist.forkserver_child"]
    multiprocessing.set_forkserver_preload(preload)


def start_forkserver() -> None:
    """Start the fork server now and wait until it can fork: a no-op child goes through it.

    The first worker would otherwise pay the server's start (its imports: seconds on a loaded
    node) inside the first `next(loader)`, where the hang watch counts it as data time. The
    child also imports the script as workers do, so an unguarded script stops here, at once.
    """
    preload_forkserver()
    child = multiprocessing.get_context("forkserver").Process(target=os.getpid, daemon=True)
    # The server is a fresh interpreter: until its preload ignores them, SIGUSR2 and SIGTERM
    # would kill it (SLURM's time-limit signal often comes seconds after the start). A blocked
    # signal stays blocked across fork and exec, and here it stays pending until unblocked.
    signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPTION_SIGNALS)
    try:
        child.start()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPTION_SIGNALS)
    child.join()
    if child.exitcode != 0:
        raise UsageError(
            f"a DataLoader worker could not start through the fork server (exit code "
            f"{child.exitcode}; its reason is printed above); or set data.num_workers=0"
        )


def stop_daemon_children(grace_s: float = 2.0) -> None:
    """At exit: what multiprocessing's exit handler does with daemonic children, with a deadline.

    That handler sends SIGTERM to every daemonic child and then waits for each, forever. A crash
    leaves its DataLoader alive in the traceback, and its workers ignore SIGTERM here (SLURM
    sends it to every process of a step; only the rank may act on it), so the wait never ended
    (seen with fork and fork server alike). Children that honour SIGTERM still get `grace_s` to
    leave; the rest are killed: they are daemons, ended with their parent by definition.
    """
    daemons = [child for child in multiprocessing.active_children() if child.daemon]
    for child in daemons:
        child.terminate()
    deadline = time.monotonic() + grace_s
    for child in daemons:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in daemons:
        if child.is_alive():
            child.kill()
            child.join()


def prefer_forkserver() -> None:
    """Make "forkserver" this process's default start method, unless one was already chosen.

    A script that needs fork for its own pools (unpicklable tasks) keeps it by calling
    `multiprocessing.set_start_method("fork")` before phalanx.init().
    """
    preload_forkserver()
    # Before multiprocessing's own exit handler: finalizers of priority >= 0 run first there.
    multiprocessing.util.Finalize(None, stop_daemon_children, exitpriority=10)
    if multiprocessing.get_start_method(allow_none=True) is not None:
        return
    multiprocessing.set_start_method("forkserver")
    log.debug("child processes start from a fork server (multiprocessing start method)")
