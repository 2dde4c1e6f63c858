"""The hang watch on a store that fails: the end of the run ends it quietly, anything else is
said once, as a warning that this run has no hang detection (real HangWatch and thread)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from torch.distributed import DistNetworkError, DistStoreError

from phalanx.lifecycle.hang import HangWatch


class FailingStore:
    """A store whose every call raises `error` (the watch publishes first: `set`)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def set(self, key: str, value: str) -> None:
        raise self.error

    def delete_key(self, key: str) -> bool:
        raise self.error


class Records(logging.Handler):
    """phalanx.hang's records; `first` is set by the first one."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.first.set()


@pytest.fixture
def records() -> Iterator[Records]:
    logger, handler = logging.getLogger("phalanx.hang"), Records()
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def watch_until_it_speaks(error: Exception, records: Records) -> list[logging.LogRecord]:
    watch = HangWatch(FailingStore(error), rank=1, world_size=2, timeout_s=0.5)
    try:
        assert records.first.wait(timeout=30), "the watch never reported its failure"
    finally:
        watch.close()  # joins the watch thread: every record it would write is written
    # Less close()'s own note that it could not withdraw the position from the broken store.
    return [r for r in records.records if not r.getMessage().startswith("hang watch: ")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "error", [ValueError("bad record"), DistStoreError("wait timeout after 300000ms")],
    ids=["bug", "store-timeout"],
)  # fmt: skip
def test_a_failing_watch_warns_once_that_hang_detection_is_off(
    error: Exception, records: Records
) -> None:
    said = [r for r in watch_until_it_speaks(error, records) if r.levelno >= logging.WARNING]
    assert len(said) == 1, [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert "hang detection is off for the rest of this run on rank 1" in message
    assert f"{type(error).__name__}: {error}" in message


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "error", [DistNetworkError("Broken pipe"), ConnectionResetError("peer gone")],
    ids=["store-gone", "connection-reset"],
)  # fmt: skip
def test_a_store_gone_at_the_end_of_the_run_ends_the_watch_quietly(
    error: Exception, records: Records
) -> None:
    said = watch_until_it_speaks(error, records)
    assert [r.levelno for r in said] == [logging.DEBUG], [r.getMessage() for r in said]
    assert "hang watch on rank 1 ends" in said[0].getMessage()


@pytest.mark.timeout(60)
def test_a_compilation_is_an_exempt_phase_until_it_ends() -> None:
    from torch.distributed import HashStore

    from phalanx.lifecycle.hang_report import EXEMPT

    watch = HangWatch(HashStore(), rank=0, world_size=1, timeout_s=60)
    try:
        watch.beat(0, "step")
        watch.compiling(True)  # the first step's compilation
        assert watch._where[:2] == (0, "compile") and "compile" in EXEMPT
        watch.compiling(False)
        assert watch._where[:2] == (0, "start")  # back to the first step's exempt phase
        watch.beat(1, "after")
        watch.beat(1, "step")
        watch.compiling(True)  # mid-run: e.g. a batch of another shape
        watch.compiling(True)
        since = watch._where[2]
        watch.compiling(False)
        assert watch._where[:2] == (1, "step") and watch._where[2] >= since  # clock restarted
        watch.compiling(False)  # an end without a start changes nothing
        assert watch._where[:2] == (1, "step")
    finally:
        watch.close()
