"""examples/finetune_lora.py with one fault injected: on its first attempt in a run directory,
rank 0 kills itself with SIGKILL right after step KILL_AT (a real kill -9: no cleanup of any
kind); run again in the same directory, it resumes like the example. Each attempt first writes
its adapters as they are after step KILL_AT (save_adapters, every rank) into
adapters-at-KILL_AT-<attempt>: equal files show that the resumed run recomputed the lost steps
bit for bit.

    phalanx run -n 2 lora_worker.py run.dir=DIR [overrides of the example...]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import phalanx
from phalanx.train import save_adapters

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))
import finetune_lora  # found through the path above

KILL_AT = 10  # after step 8's checkpoint, before step 12's


class KillOnce(phalanx.Callback):
    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        assert trainer.handle.run_dir is not None
        if trainer.state.step != KILL_AT:
            return
        run_dir = trainer.handle.run_dir.path
        marker = run_dir / "killed"
        first = not marker.exists()
        save_adapters(trainer.model, run_dir / f"adapters-at-{KILL_AT}-{1 if first else 2}")
        if first and trainer.env.rank == 0:
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    finetune_lora.main(callbacks=(KillOnce(),))
