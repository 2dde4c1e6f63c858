"""torchrun as `phalanx run` starts it: torch's own launcher, with one difference.

When the first worker to fail exited with 2 (a UsageError: bad input, printed by each rank on
one line, `phalanx.distributed`) and the others with 2 too or from the SIGTERM torchrun sends
the survivors, the job exits with 2, without torchrun's traceback and failure table: the same
line and exit code as the script run without a launcher or under srun. Any other failure is
torchrun's, unchanged (its exit code 1 and its summary).
"""

from __future__ import annotations

import signal

USAGE_ERROR = 2
STOPPED_BY_TORCHRUN = -signal.SIGTERM


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except ChildFailedError as error:
        _, first = error.get_first_failure()
        codes = {failure.exitcode for failure in error.failures.values()}
        if first.exitcode == USAGE_ERROR and codes <= {USAGE_ERROR, STOPPED_BY_TORCHRUN}:
            raise SystemExit(USAGE_ERROR) from None
        raise


if __name__ == "__main__":
    main()
