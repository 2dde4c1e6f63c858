"""Initialise and tear down torch.distributed from a detected ClusterEnv."""

from __future__ import annotations

import atexit
import gc
import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from phalanx.config.schema import Config, DistConfig
from phalanx.dist.device import select_backend, select_device
from phalanx.dist.forking import prefer_forkserver
from phalanx.dist.logging import setup_logging
from phalanx.dist.rendezvous import join_store
from phalanx.env import ClusterEnv, detect
from phalanx.env.spawned import refuse_spawned_import
from phalanx.errors import UsageError
from phalanx.rundir.layout import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Dist:
    """What init() set up: pass it to the parts that need the geometry or the device."""

    env: ClusterEnv
    device: torch.device
    backend: str
    config: Config | None = None
    """The resolved config, with run.dir filled in (when init() was given a Config)."""
    run_dir: RunDir | None = None
    """This run's directory (when init() was given a Config)."""


def _visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def init_group(config: DistConfig | None = None, *, env: ClusterEnv | None = None) -> Dist:
    """Detect the environment, pick and set the device, then join the process group.

    The device is set before the group exists so NCCL binds the right GPU. A local single
    process gets a one-rank group too, so collectives and DDP work without `if` branches.
    The group is destroyed at interpreter exit (or by shutdown() / the distributed() context).
    """
    refuse_spawned_import()
    prefer_forkserver()
    config = config or DistConfig()
    if dist.is_initialized():
        raise UsageError("torch.distributed is already initialised; call phalanx.init() once")
    env = env or detect(launcher=config.launcher, slurm=config.slurm)
    if config.setup_logging:
        setup_logging(env)  # again with the run's log file once the run directory exists
    device = torch.device(select_device(env, _visible_gpus()))
    backend = select_backend(config.backend, str(device))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=config.timeout_s)
    enable_flight_recorder(config.flight_recorder, os.environ)
    device_id = device if backend == "nccl" else None
    if env.launcher == "local":
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(
            backend, store=store, rank=0, world_size=1, timeout=timeout, device_id=device_id
        )
    elif env.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group(
            backend, store=_attempt_store(env, timeout), rank=env.rank,
            world_size=env.world_size, timeout=timeout, device_id=device_id,
        )  # fmt: skip
    else:
        # Other launchers (and torchrun without an agent store) meet at rank 0's host, with a
        # deadline of their own: torch's rendezvous would wait `timeout` and name no one.
        store = join_store(env, deadline_s=config.rendezvous_timeout_s, timeout=timeout)
        dist.init_process_group(
            backend, store=store, rank=env.rank, world_size=env.world_size,
            timeout=timeout, device_id=device_id,
        )  # fmt: skip
    atexit.register(shutdown)
    log.debug("joined %s group of %d ranks on %s", backend, env.world_size, device)
    return Dist(env=env, device=device, backend=backend)


FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch's flight-recorder buffer size, under its name and its older NCCL-only name (which
torch 2.13 reads with a deprecation warning: phalanx sets only the first)."""


def enable_flight_recorder(entries: int, environ: Any) -> None:
    """torch's record of the last collectives, read after a hang (phalanx.lifecycle.
    flight_recorder); set before the process group exists. The user's own setting wins."""
    if entries > 0 and not any(name in environ for name in FLIGHT_RECORDER_VARS):
        environ[FLIGHT_RECORDER_VARS[0]] = str(entries)


def _attempt_store(env: ClusterEnv, timeout: timedelta) -> Any:
    """The torchrun agent's store, seen through a prefix of this restart attempt.

    torchrun keeps one store for all attempts of `--max-restarts`, and env:// uses it without a
    prefix: a restarted rank can read a dead rank's gloo address from the attempt before and
    fail with "connectFullMesh ... Connection refused" (measured with torch 2.13 and plain
    torchrun), and any key phalanx keeps there (the hang watchdog's) would outlive its attempt.
    """
    client = dist.TCPStore(  # type: ignore[attr-defined]
        env.master_addr, env.master_port, world_size=env.world_size, is_master=False,
        timeout=timeout,
    )  # fmt: skip
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"phalanx/attempt-{attempt}/", client)  # type: ignore[attr-defined]


def shutdown() -> None:
    """Destroy the process group if one exists; safe to call twice and after errors."""
    # Free unreachable DDP reducers and pending gloo work while the interpreter is fully alive:
    # destroyed during interpreter finalization they can abort the process ("terminate called
    # without an active exception", pytorch/pytorch#179291). Also after phalanx.distributed()
    # has torn the group down: this runs at exit, when the user's main() has returned and its
    # Trainer (kept alive by reference cycles) is unreachable, so collected here, not later.
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
