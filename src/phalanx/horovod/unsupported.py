"""Horovod features phalanx.horovod does not offer: each fails with one line and the alternative.

Nothing here changes numerics silently: a call that cannot be honoured stops the script.
"""

from __future__ import annotations

from typing import NoReturn

from phalanx.errors import UsageError

ALTERNATIVES = {
    "Adasum": "use op=hvd.Average (the default) or hvd.Sum",
    "process sets": (
        "run one job per set, or use torch.distributed.new_group() directly; "
        "phalanx.horovod always reduces over all ranks"
    ),
    "the timeline": ("profile with torch.profiler (its traces include the gloo/NCCL collectives)"),
    "an mpi4py communicator": "call hvd.init() without comm; ranks come from the launcher",
    "sparse gradients": "use dense gradients (e.g. nn.Embedding(sparse=False))",
    "sparse_as_dense=False with sparse tensors": "pass dense tensors",
    "hvd.elastic changes of membership": (
        "use phalanx run --nnodes MIN:MAX --max-restarts K with phalanx.Checkpointer"
    ),
}


class UnsupportedError(UsageError):
    """A Horovod feature that phalanx.horovod deliberately does not emulate."""


def refuse(feature: str) -> NoReturn:
    """Raise the one-line refusal for `feature` (a key of ALTERNATIVES)."""
    raise UnsupportedError(f"phalanx.horovod does not support {feature}; {ALTERNATIVES[feature]}")
