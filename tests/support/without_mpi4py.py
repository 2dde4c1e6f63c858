"""Run a script or module as on a machine where mpi4py is not installed.

    python without_mpi4py.py SCRIPT ARGS...
    python without_mpi4py.py -m MODULE ARGS...

A None entry in sys.modules makes every `import mpi4py` (and `from mpi4py import MPI`) raise
ModuleNotFoundError, exactly what a missing package raises, while the venv stays untouched for
the other tests. The target then runs in this same process through runpy, as `python` would.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        sys.exit("usage: without_mpi4py.py SCRIPT ARGS... | -m MODULE ARGS...")
    sys.modules["mpi4py"] = None  # type: ignore[assignment]
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
