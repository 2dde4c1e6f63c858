"""How a process reports an error that stops the job before it starts: one line for the job.

Such an error (bad launcher set-up, a double spawn, a wrong config key) is the same on every
process, so one process speaks for all. Which one depends on the launcher, because torchrun and
mpirun stop every other process as soon as one exits with an error: rank 0 may be killed before
it prints (seen in CI under load, where rank 1 exited first). Under torchrun each worker also
writes the line into its error file, and torchrun's failure summary shows the first failed
worker's file; mpirun has no such file, so there every rank prints. srun lets the other tasks
finish unless it kills on a bad exit (`SLURM_KILL_BAD_EXIT=1`, as `phalanx submit` exports it;
the `--kill-on-bad-exit` flag is invisible to the tasks): then every task prints, as under mpirun.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from phalanx.env.detect import is_first_process
from phalanx.env.mpi import is_mpi
from phalanx.env.slurm import is_slurm_step
from phalanx.env.torchrun import is_torchrun


def prints_start_error(environ: Mapping[str, str]) -> bool:
    """True in each process that prints a start-up error (see the module docstring)."""
    return is_first_process(environ) or is_mpi(environ) or _srun_kills_the_rest(environ)


def _srun_kills_the_rest(environ: Mapping[str, str]) -> bool:
    # Under torchrun inside srun the workers' error files carry the line (see above).
    killing = environ.get("SLURM_KILL_BAD_EXIT", "").strip() == "1"
    return killing and is_slurm_step(environ) and not is_torchrun(environ)


def report_start_error(line: str, environ: Mapping[str, str], *, every_rank: bool = False) -> None:
    """Write `line` into torchrun's error file (if any) and print it where it is this process's
    turn; `every_rank` for an error only this rank can report (it cannot reach rank 0)."""
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        # The layout of torch's own ErrorHandler.record_exception, minus the traceback.
        record = {"message": {"message": line, "extraInfo": {"timestamp": str(int(time.time()))}}}
        with contextlib.suppress(OSError):
            Path(path).write_text(json.dumps(record))
    if every_rank or prints_start_error(environ):
        print(line, file=sys.stderr, flush=True)
