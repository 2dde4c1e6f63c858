"""Talk to peers: process-group set-up and teardown, device choice, collectives, logging."""

from phalanx.dist.collectives import (
    all_gather_object,
    all_reduce_scalars,
    barrier,
    broadcast_object,
    gather_object,
    main_process_first,
)
from phalanx.dist.device import select_backend, select_device
from phalanx.dist.logging import setup_logging
from phalanx.config.schema import DistConfig
from phalanx.dist.process_group import Dist, init_group, shutdown

__all__ = [
    "Dist",
    "DistConfig",
    "all_gather_object",
    "all_reduce_scalars",
    "barrier",
    "broadcast_object",
    "gather_object",
    "init_group",
    "main_process_first",
    "select_backend",
    "select_device",
    "setup_logging",
    "shutdown",
]
