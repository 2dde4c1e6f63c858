"""Horovod's process-set names, so scripts that pass the default set keep working."""

from __future__ import annotations

from typing import Any

from phalanx.horovod.unsupported import refuse


class ProcessSet:
    """Only the global set exists; creating another one is refused."""

    def __init__(self, ranks: Any = None) -> None:
        if ranks is not None:
            refuse("process sets")

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


def add_process_set(process_set: Any) -> ProcessSet:
    refuse("process sets")


def remove_process_set(process_set: Any) -> bool:
    refuse("process sets")
