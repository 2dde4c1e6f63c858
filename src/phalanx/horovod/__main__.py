"""`python -m phalanx.horovod --check-build`: what this phalanx.horovod can do here."""

from __future__ import annotations

import argparse
import sys

import torch

from phalanx.horovod import basics


def _mark(ok: bool) -> str:
    return "[X]" if ok else "[ ]"


def check_build() -> str:
    """A report in the spirit of `horovodrun --check-build`, for this shim."""
    rows = [
        f"phalanx.horovod on torch {torch.__version__} (collectives run on torch.distributed)",
        "",
        "Frameworks:",
        f"    {_mark(True)} PyTorch",
        "    [ ] TensorFlow, MXNet (not offered)",
        "",
        "Launchers (ranks detected by phalanx):",
        "    [X] mpirun   [X] srun   [X] torchrun   [X] phalanx run   [ ] horovodrun",
        "",
        "Tensor operations:",
        f"    {_mark(basics.gloo_built())} Gloo (CPU tensors)",
        f"    {_mark(basics.nccl_built())} NCCL (CUDA tensors)",
        f"    {_mark(basics.mpi_built())} MPI (mpirun only starts the ranks)",
        "    [ ] DDL, CCL",
        "",
        "Not supported (one-line error with the alternative): Adasum, process sets, timeline",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m phalanx.horovod", description=__doc__)
    parser.add_argument("--check-build", action="store_true", help="print what is available")
    args = parser.parse_args(argv)
    if not args.check_build:
        parser.print_help()
        return 2
    print(check_build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
