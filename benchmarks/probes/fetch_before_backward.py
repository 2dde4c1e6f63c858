"""Does the launching thread block less when the loader's next batch is asked for just before the
backward (issue #17, session 19)?

    torchrun --standalone --nproc_per_node=1 benchmarks/probes/fetch_before_backward.py \\
        [--early] [step_pairs args]

The hypothesis, from session 18's counts (12.7-15 voluntary context switches of the launching
thread a step with the default loader, 1 with `data.num_workers=0`): torch's pin-memory thread
handles one batch a step, the one a worker made after the Trainer took the previous batch; the
Trainer takes it after the optimizer step, so that batch reaches the pin thread early in the
next forward, where the launching thread runs Python and every op it calls releases the GIL: the
pin thread takes it at each of its own steps (receive, rebuild, pin, hand over) and the
launching thread waits each time (a longer switch interval changed nothing: log, Session 19).
In the backward the launching thread waits on the autograd engine without the GIL (eager).

Without `--early` this runs `step_pairs.py` unchanged. With it, the Trainer's device feed takes
the next step's batches from the loader just before each backward (the request to a worker
leaves then, and its batch reaches the pin thread during the backward) and starts their copy to
the device after the step, where it always did: the same batches, in the same order, the
device's memory unchanged (at a run's or epoch's last step it takes batches nobody uses: the
Trainer would not prefetch there). Both print step_pairs' table and, per side and step, the
launching thread's scheduling (`switches_by_side.py`'s columns). Patched in this process only;
phalanx's code is unchanged. Run the two alternately in one call.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

# switches_by_side.py lives beside this file (and puts step_pairs.py's folder on the path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import switches_by_side

import phalanx.train.trainer as trainer_module
from phalanx.train.feeding import DeviceFeed
from phalanx.train.precision import Precision


def early_feed() -> tuple[type[DeviceFeed], Callable[[], None]]:
    """A DeviceFeed whose next step's batches can be taken early, and the call that does so for
    the feed made last (the Trainer makes one per epoch)."""
    # Weak, so the last feed's loader iterator (its workers, its pin thread) ends with the epoch:
    # with a strong reference the patched runs took ~40 s longer to exit than the plain ones on
    # a GPU host (session 21; presumably that iterator's shutdown at the interpreter's exit).
    current: list[weakref.ref[DeviceFeed]] = []

    class EarlyFeed(DeviceFeed):
        def __init__(self, it: Iterator[Any], device: torch.device, per_step: int) -> None:
            super().__init__(it, device, per_step)
            self._source, self._host = it, None
            self.early = 0  # steps whose batches were taken before a backward
            current[:] = [weakref.ref(self)]

        def fetch_ahead(self) -> None:
            if self._host is None:  # once a step: the first micro-batch's backward
                self._host = list(itertools.islice(self._source, self._per_step))
                self.early += 1

        def prefetch(self) -> None:
            host, self._host = self._host, None
            if host is None:
                return super().prefetch()
            self._it = iter(host)  # the base class reads only these; the source is put back
            try:
                super().prefetch()
            finally:
                self._it = self._source

    def fetch_ahead() -> None:
        for ref in current:
            if (feed := ref()) is not None:
                feed.fetch_ahead()  # type: ignore[attr-defined]

    return EarlyFeed, fetch_ahead


def ask_before_backward() -> type[DeviceFeed]:
    """Patches this process's Trainer (its feed class, Precision.backward); returns the class."""
    feed_class, fetch_ahead = early_feed()
    trainer_module.DeviceFeed = feed_class  # type: ignore[misc]
    plain = Precision.backward

    def backward(self: Precision, loss: torch.Tensor) -> None:
        fetch_ahead()
        plain(self, loss)

    Precision.backward = backward  # type: ignore[method-assign]
    return feed_class


def main() -> None:
    if "--control" in sys.argv:
        print("fetch_before_backward.py: --control builds no Trainer; use step_pairs.py --control",
              file=sys.stderr)  # fmt: skip
        sys.exit(2)
    if "--early" in sys.argv:
        sys.argv.remove("--early")
        ask_before_backward()
    switches_by_side.main()  # step_pairs.py's run, with the scheduling counts per side


if __name__ == "__main__":
    main()
