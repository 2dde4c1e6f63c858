"""Behave in processes that only import the training script again: refuse to train there, and
keep DCP's checkpoint writer quiet.

Processes started with the "spawn" or "forkserver" method (DataLoader workers, whose fork
server phalanx uses by default; DCP's checkpoint writer with checkpoint.async_writer=process) run
the main script once more, as module `__mp_main__`, before doing their own work. A script that
trains at import, without an `if __name__ == "__main__":` guard, would there join the process
group a second time and train again, or hang.
"""

from __future__ import annotations

import logging
import os
import sys
from types import FrameType

UNGUARDED_SCRIPT = (
    "a helper process (DataLoader workers' fork server, the checkpoint writer of "
    "checkpoint.async_writer=process) imported the training script again, and the script "
    'starts training at import; put the training under `if __name__ == "__main__":`'
)


def refuse_spawned_import() -> None:
    """Exit with one line (code 2) when called from a script that a spawned process imports.

    That process is not ours to unwind (multiprocessing prints a traceback for any exception
    there, and its parent waits for it), so this exits at once; the parent reports the death.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            print(f"phalanx: error: {UNGUARDED_SCRIPT}", file=sys.stderr, flush=True)
            os._exit(2)
        frame = frame.f_back


def _not_writer_chatter(record: logging.LogRecord) -> bool:
    """False for torch checkpoint records below WARNING logged straight to the root logger."""
    if record.levelno >= logging.WARNING or record.name != "root":
        return True
    return "torch/distributed/checkpoint" not in record.pathname.replace(os.sep, "/")


def quiet_checkpoint_writer() -> None:
    """In a spawned process, drop the INFO lines DCP's writer logs (about six per save and rank).

    torch's writer process (checkpoint.async_writer=process) sets the root logger to INFO with a
    stderr handler of its own, so every save would print "Received ... / Completed ... / Waiting
    ..." once per rank; its warnings and errors still pass. A filter on the root logger is the only
    hook: the writer's code runs in a fresh interpreter, where phalanx gets imported only as part
    of the training script it re-imports (as `__mp_main__`, before the writer's own code starts).
    """
    if "__mp_main__" in sys.modules:
        logging.getLogger().addFilter(_not_writer_chatter)  # once: addFilter skips a repeat
