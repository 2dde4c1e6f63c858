"""Where each side's step time goes on a noisy host, by the launching thread's scheduling
(issue #17, session 18).

    torchrun --standalone --nproc_per_node=1 benchmarks/probes/switches_by_side.py [step_pairs args]

Runs `step_pairs.py` unchanged and, at every switch between the hand loop's and the Trainer's
windows, reads the launching thread's rusage (CPU time, voluntary and involuntary context
switches), the whole process's CPU time (the other threads: the loader's pin thread, watchdogs)
and the host's CPU steal from /proc/stat. Per side and step it prints: wall ms, the launching
thread's CPU ms, the other threads' CPU ms, voluntary switches (the thread blocked: a lock, the
GIL, a device wait), involuntary switches (it was preempted) and steal ms. A diagnosis, not a
benchmark: a step slower at equal CPU that blocks more often waits on something in the process;
one preempted more often waits for a CPU.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

# step_pairs.py and its helpers live one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import step_pairs

FIELDS = ("wall", "thread_cpu", "other_cpu", "voluntary", "involuntary", "steal")


def _steal_s() -> float:
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    return int(cpu[8]) / os.sysconf("SC_CLK_TCK") if len(cpu) > 8 else 0.0


def _sample() -> dict[str, float]:
    thread = resource.getrusage(resource.RUSAGE_THREAD)
    process = resource.getrusage(resource.RUSAGE_SELF)
    thread_cpu = thread.ru_utime + thread.ru_stime
    return {
        "wall": time.perf_counter(),
        "thread_cpu": thread_cpu,
        "other_cpu": process.ru_utime + process.ru_stime - thread_cpu,
        "voluntary": thread.ru_nvcsw,
        "involuntary": thread.ru_nivcsw,
        "steal": _steal_s(),
    }


class Tally:
    def __init__(self) -> None:
        self.calls = 0
        self.last: dict[str, float] | None = None
        self.totals: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.steps: collections.Counter[str] = collections.Counter()

    def close(self, side: str, steps: int) -> None:
        now = _sample()
        if self.last is not None and steps:
            for key in FIELDS:
                self.totals[side][key] += now[key] - self.last[key]
            self.steps[side] += steps
        self.last = now

    def wrap(self, hand_loop: Any) -> Any:
        def built(args: Any, d: Any) -> Any:
            steps = hand_loop(args, d)

            def timed(n: int) -> None:  # the first call is step_pairs' warm-up
                self.calls += 1
                # The Trainer's window just ended (none before the second call).
                self.close("trainer", n if self.calls > 2 else 0)
                steps(n)
                # The hand loop's queued work drains here, not in the Trainer's interval (a
                # device synchronisation spins: it counts as the waiting thread's CPU time).
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                self.close("hand", n if self.calls > 1 else 0)

            return timed

        return built

    def report(self) -> None:
        print(f"{'side':<9}" + "".join(f"{k:>13}" for k in FIELDS) + "   (per step; ms or count)")
        for side in ("hand", "trainer"):
            n = self.steps[side] or 1
            row = [self.totals[side][k] / n * (1 if "voluntary" in k else 1e3) for k in FIELDS]
            print(f"{side:<9}" + "".join(f"{v:>13.3f}" for v in row))


def main() -> None:
    tally = Tally()
    step_pairs.hand_loop = tally.wrap(step_pairs.hand_loop)
    try:
        step_pairs.main()
    finally:
        tally.report()


if __name__ == "__main__":
    main()
