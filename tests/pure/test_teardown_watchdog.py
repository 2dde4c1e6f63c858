"""The teardown watchdog: a hang while leaving becomes a stack dump and exit 1, not a stuck job."""

from __future__ import annotations

import subprocess
import sys

import pytest

HANG_AFTER = """
import threading
from phalanx.session import teardown
teardown(failed={failed}, timeout_s=1.0)
threading.Event().wait({wait})  # stands for a teardown or interpreter exit that never returns
print("survived")
"""


def _run(failed: bool, wait: float | None) -> subprocess.CompletedProcess[str]:
    code = HANG_AFTER.format(failed=failed, wait=wait)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.timeout(40)
def test_a_hang_after_a_failed_run_dumps_stacks_and_exits() -> None:
    result = _run(failed=True, wait=None)
    assert result.returncode == 1
    assert "survived" not in result.stdout
    assert "Timeout" in result.stderr and "most recent call first" in result.stderr
    assert "<string>" in result.stderr  # the stuck frame is named


@pytest.mark.timeout(40)
def test_after_a_clean_teardown_the_script_goes_on() -> None:
    result = _run(failed=False, wait=3.0)  # three times the watchdog's delay
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "survived"
