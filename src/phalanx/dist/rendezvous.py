"""Joining at rank 0's store with a deadline, and a message naming who did not arrive.

torch's own tcp:// / env:// rendezvous waits the whole collective timeout (`dist.timeout_s`,
600 s by default) with nothing printed, then names no rank. Here rank 0 hosts the store, every
rank checks in under its rank, and rank 0 waits for all of them until
`dist.rendezvous_timeout_s`, reporting every REPORT_EVERY_S who is still missing. It then tells
the others the outcome, so one line says what went wrong: rank 0 names the missing ranks; a rank
that cannot reach rank 0 at all says so itself (rank 0 cannot speak for it).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

from phalanx.env import ClusterEnv
from phalanx.env.node_addr import resolves
from phalanx.errors import UsageError, first_line

log = logging.getLogger(__name__)

REPORT_EVERY_S = 30.0
"""How often rank 0 logs the ranks it still waits for (a normal start never sees one)."""
OUTCOME_GRACE_S = 30.0
"""How much longer than the deadline a rank that checked in waits for rank 0's verdict."""
ACK_WAIT_S = 5.0
"""How long a failing rank 0 keeps its store up so the others can read the verdict."""

_ARRIVED = "phalanx/rendezvous/arrived/"
_OUTCOME = "phalanx/rendezvous/outcome"
_ACK = "phalanx/rendezvous/ack/"


class RendezvousError(UsageError):
    """The group could not form. `every_rank`: this rank must report it itself."""

    def __init__(self, message: str, *, every_rank: bool = False) -> None:
        super().__init__(message)
        self.every_rank = every_rank


def join_store(env: ClusterEnv, *, deadline_s: float, timeout: timedelta) -> Any:
    """The store at rank 0's master_addr:master_port, once every rank has checked in.

    Afterwards its operations wait `timeout` (the collective timeout), as torch's would.
    """
    store = _open(env, deadline_s)
    store.set(f"{_ARRIVED}{env.rank}", socket.gethostname())
    if env.rank == 0:
        _admit_everyone(store, env, deadline_s)
    else:
        _await_verdict(store, env, deadline_s)
    store.set_timeout(timeout)
    return store


def _open(env: ClusterEnv, deadline_s: float) -> Any:
    where = f"{env.master_addr}:{env.master_port}"
    if not resolves(env.master_addr):
        # Else c10d retries the name until the deadline. The same on every rank of a node set
        # up alike, so one line (the first process's) tells it.
        raise RendezvousError(
            f"rank 0's address {env.master_addr!r} does not resolve on {socket.gethostname()} "
            "(DNS, /etc/hosts); export MASTER_ADDR=<address of rank 0's node> for every rank"
        )
    try:
        if env.rank != 0:
            _await_listener(env.master_addr, env.master_port, deadline_s)
        return dist.TCPStore(  # type: ignore[attr-defined]
            env.master_addr, env.master_port, world_size=env.world_size,
            is_master=env.rank == 0, timeout=timedelta(seconds=deadline_s),
            wait_for_workers=False,
        )  # fmt: skip
    except (RuntimeError, OSError) as error:  # c10d's DistNetworkError is a RuntimeError
        if env.rank == 0:
            raise RendezvousError(
                f"rank 0 on {socket.gethostname()} cannot host the rendezvous at {where} "
                f"({first_line(error)}); export MASTER_PORT=<a free port> (and MASTER_ADDR="
                "<this node's address>) for every rank"
            ) from None
        raise RendezvousError(
            f"[rank {env.rank}] rank 0's rendezvous at {where} did not answer within "
            f"{deadline_s:.0f} s (dist.rendezvous_timeout_s): rank 0 did not start (see its "
            f"output) or {env.master_addr} is not reachable from {socket.gethostname()}; "
            "export MASTER_ADDR=<address of rank 0's node that every node reaches>",
            every_rank=True,
        ) from None


def _await_listener(host: str, port: int, deadline_s: float) -> None:
    """Return once rank 0's port accepts connections; raise OSError after the deadline.

    Probed here rather than by TCPStore's own retries, which print a C++ stack trace to
    stderr for every failed attempt.
    """
    deadline = time.monotonic() + deadline_s
    pause = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, 5.0), 0.01)):
                return
        except OSError:
            if left <= pause:
                raise
        time.sleep(pause)  # a connection retry, not a synchronisation: rank 0 may start later
        pause = min(pause * 2, 1.0)


def _admit_everyone(store: Any, env: ClusterEnv, deadline_s: float) -> None:
    """Wait until every rank checked in; report who is missing every REPORT_EVERY_S.

    Polled with check() rather than wait(): a wait() that times out logs two c10d warnings.
    """
    keys = [f"{_ARRIVED}{rank}" for rank in range(env.world_size)]
    start = time.monotonic()
    report_at, pause = REPORT_EVERY_S, 0.01
    while not store.check(keys):
        waited = time.monotonic() - start
        if waited >= min(report_at, deadline_s):
            missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
            if waited >= deadline_s:
                _fail(store, env, missing, deadline_s)
            log.warning(
                "rendezvous at %s:%d: %d of %d ranks not here after %.0f s (%s); waiting up to "
                "dist.rendezvous_timeout_s=%.0f s",
                env.master_addr, env.master_port, len(missing), env.world_size, waited,
                _ranks(missing), deadline_s,
            )  # fmt: skip
            report_at += REPORT_EVERY_S
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
    store.set(_OUTCOME, "ok")


def _fail(store: Any, env: ClusterEnv, missing: list[int], deadline_s: float) -> NoReturn:
    store.set(_OUTCOME, "failed")
    arrived = [f"{_ACK}{rank}" for rank in range(1, env.world_size) if rank not in missing]
    with contextlib.suppress(RuntimeError):
        # The others read the verdict from this store: keep it up until they have.
        store.wait(arrived, timedelta(seconds=ACK_WAIT_S))
    raise RendezvousError(
        f"{len(missing)} of {env.world_size} ranks never reached rank 0's rendezvous at "
        f"{env.master_addr}:{env.master_port} within {deadline_s:.0f} s ({_ranks(missing)}): "
        "see their output (a crash before phalanx.distributed(), a MASTER_ADDR they cannot "
        "reach); raise dist.rendezvous_timeout_s if their start is just slow"
    )


def _await_verdict(store: Any, env: ClusterEnv, deadline_s: float) -> None:
    try:
        store.wait([_OUTCOME], timedelta(seconds=deadline_s + OUTCOME_GRACE_S))
        outcome = store.get(_OUTCOME)
    except RuntimeError as error:
        raise RendezvousError(
            f"[rank {env.rank}] rank 0's rendezvous at {env.master_addr}:{env.master_port} "
            f"stopped answering ({first_line(error)}); see rank 0's output",
            every_rank=True,
        ) from None
    store.set(f"{_ACK}{env.rank}", "")
    if outcome != b"ok":
        # Rank 0 prints the line that names the missing ranks; this rank only stops.
        raise RendezvousError("the rendezvous failed; rank 0 names the ranks that did not arrive")


def _ranks(ranks: list[int], shown: int = 8) -> str:
    listed = ", ".join(str(rank) for rank in ranks[:shown])
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {listed}{more}"
