"""Host memory of benchmarks/checkpoint_at_size_train.py: this process, its children (the async
writer process), the node and /dev/shm, sampled from a thread."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path


def status_kb(pid: int | str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> list[str]:
    pids: list[str] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += (task / "children").read_text().split()
    return pids


def host_memory() -> dict[str, float]:
    """This process's RSS, its children's (the writer process), system use and /dev/shm, GB."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    shm = os.statvfs("/dev/shm")
    return {
        "rss_gb": status_kb("self", "VmRSS") / 1e6,
        "children_rss_gb": sum(status_kb(pid, "VmRSS") for pid in _children()) / 1e6,
        "system_used_gb": (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))
        / 1e6,
        "shm_used_gb": (shm.f_blocks - shm.f_bfree) * shm.f_frsize / 1e9,
    }


class HostSampler:
    """Peaks of `host_memory()` since the last `reset`, sampled every 50 ms from a thread; also
    when `watch()` (an async write in flight) first turns False."""

    def __init__(self) -> None:
        self.peaks: dict[str, float] = {}
        self.write_end: float | None = None
        self._watch: Callable[[], bool] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def reset(self, watch: Callable[[], bool] | None) -> None:
        with self._lock:
            self.peaks, self.write_end, self._watch = host_memory(), None, watch

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = host_memory()
            with self._lock:
                self.peaks = {k: max(v, self.peaks.get(k, 0.0)) for k, v in now.items()}
                if self._watch is not None and self.write_end is None and not self._watch():
                    self.write_end = time.perf_counter()
