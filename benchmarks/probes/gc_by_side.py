"""Garbage collections by side in `step_pairs.py`'s alternating windows (issue #17, session 17).

    torchrun --standalone --nproc_per_node=1 benchmarks/probes/gc_by_side.py [step_pairs args]

Runs `step_pairs.py` unchanged with a `gc.callbacks` hook that counts each generation's
collections and their pause, by who was running: the hand loop's warm-up, the Trainer's warm-up
(its compilation), then the timed windows of each side. Full collections are printed as they
happen. A diagnosis, not a benchmark: it was used to rule out collection pauses as the cause of
slow Trainer windows.
"""

from __future__ import annotations

import collections
import gc
import sys
import time
from pathlib import Path
from typing import Any

# step_pairs.py and its helpers live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import step_pairs


class Tally:
    def __init__(self) -> None:
        self.side = "trainer-warmup"
        self.calls = 0
        self.pauses: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        self.pauses[(self.side, info["generation"])].append(pause)
        if info["generation"] == 2:
            print(f"full collection in {self.side}: {pause * 1e3:.0f} ms, {info}")

    def wrap(self, hand_loop: Any) -> Any:
        def built(args: Any, d: Any) -> Any:
            steps = hand_loop(args, d)

            def timed(n: int) -> None:  # the first call is step_pairs' warm-up
                self.calls += 1
                timed_run = self.calls > 1
                self.side = "hand" if timed_run else "hand-warmup"
                steps(n)
                self.side = "trainer" if timed_run else "trainer-warmup"

            return timed

        return built


def main() -> None:
    tally = Tally()
    step_pairs.hand_loop = tally.wrap(step_pairs.hand_loop)
    gc.callbacks.append(tally)
    try:
        step_pairs.main()
    finally:
        gc.callbacks.remove(tally)
        for (side, generation), pauses in sorted(tally.pauses.items()):
            print(f"{side:<15} generation {generation}: {len(pauses):>5} collections, "
                  f"{sum(pauses) * 1e3:8.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
