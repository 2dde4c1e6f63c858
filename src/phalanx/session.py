"""phalanx.init / phalanx.distributed: the process group plus, given a Config, the run directory.

Order matters: the group exists first, so rank 0 can choose (and create) the run directory and
broadcast its path; then every rank logs into logs/rank-K.log, rank 0 writes config.yaml and each
node's local rank 0 its diagnostics.
"""

from __future__ import annotations

import atexit
import dataclasses
import faulthandler
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from phalanx.config.schema import Config, DistConfig
from phalanx.dist.collectives import barrier, broadcast_object
from phalanx.dist.logging import setup_logging
from phalanx.dist.process_group import Dist, init_group, shutdown
from phalanx.env import ClusterEnv, report_start_error
from phalanx.errors import UsageError
from phalanx.lifecycle.preemption import RunInterrupted
from phalanx.rundir.diagnostics import write_diagnostics
from phalanx.rundir.layout import RunDir
from phalanx.rundir.resolve import choose_dir, with_dir, write_config
from phalanx.train.guard import NonFiniteError

log = logging.getLogger("phalanx")

TEARDOWN_TIMEOUT_S = 60.0
"""How long leaving the group (and, after an error, the interpreter) may take before the
process dumps every thread's stack to stderr and exits with code 1."""


def init(config: Config | DistConfig | None = None, *, env: ClusterEnv | None = None) -> Dist:
    """Join the process group; with a full Config also open the run directory.

    The group is destroyed at interpreter exit, by shutdown(), or by `distributed()`'s block.
    """
    if isinstance(config, Config):
        handle = init_group(config.dist, env=env)
        handle = _open_run(handle, config)
    else:
        handle = init_group(config, env=env)
    dist_config = config.dist if isinstance(config, Config) else config
    if dist_config is not None and dist_config.preflight:
        _preflight(handle)
    return handle


def _preflight(handle: Dist) -> None:
    """dist.preflight: name slow or failing ranks before training (phalanx.doctor.preflight)."""
    from phalanx.doctor.preflight import check_ranks, problems, summary

    began = time.perf_counter()
    checks, allreduce_ms = check_ranks(handle.device)
    if handle.env.is_main_process:
        log.info("%s", summary(checks, allreduce_ms, time.perf_counter() - began))
        for line in problems(checks):
            log.warning("preflight: %s", line)


def _open_run(handle: Dist, config: Config) -> Dist:
    env = handle.env
    chosen = choose_dir(config, os.environ, create=True) if env.is_main_process else None
    shared = broadcast_object(str(chosen) if chosen else None)
    assert shared is not None, "rank 0 always chooses a run directory"
    path = Path(shared)
    config = with_dir(config, path)
    run_dir = RunDir(Path(config.run.dir)).ensure()
    if config.dist.setup_logging:
        setup_logging(env, log_file=run_dir.log_file(env.rank))
    log.info(
        "rank %d/%d (local %d/%d, node %d/%d) launcher=%s device=%s backend=%s run_dir=%s",
        env.rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        env.node_rank,
        env.num_nodes,
        env.launcher,
        handle.device,
        handle.backend,
        run_dir.path,
    )
    if env.is_main_process:
        write_config(config, run_dir)
    write_diagnostics(run_dir, env, os.environ)
    if config.run.dry_run and env.is_main_process:
        # A smoke run keeps nothing; registered after shutdown so it runs first.
        atexit.register(shutil.rmtree, run_dir.path, ignore_errors=True)
    barrier()  # nobody trains before the run directory is complete
    return dataclasses.replace(handle, config=config, run_dir=run_dir)


@contextmanager
def distributed(config: Config | DistConfig | None = None) -> Iterator[Dist]:
    """`with phalanx.distributed(cfg) as d:` -- init on entry, teardown on exit, also on errors.

    A UsageError while the run starts (launcher set-up, rank 0's address, the rendezvous, a
    missing package) ends the process with exit code 2 and one line per job, no traceback.
    """
    handle = _start(config)
    code = 0
    try:
        yield handle
        # Leave together: a rank that tears down while a peer still talks to it breaks the peer.
        barrier()
    except (UsageError, NonFiniteError, RunInterrupted) as error:
        # Bad input, an agreed NaN stop, or a preemption after its checkpoint: one line per
        # rank, no traceback (exit 2 / 1 / 128 + signal).
        prefix = f"[rank {handle.env.rank}] " if handle.env.world_size > 1 else ""
        kind = "" if isinstance(error, RunInterrupted) else "error: "
        print(f"{prefix}{kind}{error}", file=sys.stderr, flush=True)
        code = 2 if isinstance(error, UsageError) else 1
        code = error.exit_code if isinstance(error, RunInterrupted) else code
    finally:
        teardown(failed=code != 0)
    if code:
        # Raised outside the except block: the failed frames (models, loaders) are released
        # now, not at interpreter exit after the process group is gone.
        raise SystemExit(code)


def _start(config: Config | DistConfig | None) -> Dist:
    try:
        return init(config)
    except UsageError as error:
        every_rank = getattr(error, "every_rank", False)
        report_start_error(f"error: {error}", os.environ, every_rank=every_rank)
        raise SystemExit(2) from None


def teardown(*, failed: bool, timeout_s: float = TEARDOWN_TIMEOUT_S) -> None:
    """Destroy the group under a watchdog: a teardown that hangs becomes a stack dump and exit 1.

    Seen once in CI (2 loaded cores): both ranks had stopped on an agreed NaN and printed the
    message, then one never exited, so torchrun waited forever. After an error the watchdog
    stays armed until the interpreter is gone (a frame released at exit can hang too); after
    success it is disarmed, since the user's script may go on.
    """
    faulthandler.dump_traceback_later(timeout_s, exit=True)
    shutdown()
    if not failed:
        faulthandler.cancel_dump_traceback_later()
