"""One launch whose results several tests read, run once per test session even when pytest-xdist
hands those tests to different workers (a module-scoped fixture alone would launch once per
worker). The first worker to ask launches, under a file lock in the session's shared temporary
folder; the others wait for the lock and read what it wrote. A launch that failed wrote nothing:
the next test to ask launches again (and fails with its own message)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock


def once_per_session(
    factory: pytest.TempPathFactory, key: str, launch: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """`launch(out)`'s results for `key`, computed by the first worker that asks."""
    base = factory.getbasetemp()
    # Under xdist each worker's base folder sits in the session's: share that one.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock")):
        if done.exists():
            return json.loads(done.read_text())  # type: ignore[no-any-return]
        out = root / key
        out.mkdir(exist_ok=True)
        results = launch(out)
        done.write_text(json.dumps(results))
        return results
