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


def refuse_process_set(process_set: Any) -> None:
    """Only the global set (Horovod's default argument) is accepted."""
    if process_set is not None and process_set is not global_process_set:
        refuse("process sets")
