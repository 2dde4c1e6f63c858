"""What a run that does not shard imports: never torch's FSDP2, DTensor or DCP modules (~0.6 s of
CPU in every process that imports phalanx.train: each rank's script resolution, fork server and
DataLoader worker; phalanx.dist.sharded_types)."""

from __future__ import annotations

import subprocess
import sys

SHARDING = ("torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint")
CODE = f"""
import sys
import phalanx
from phalanx.train import Trainer, evaluate, optimizer_step, unwrap, wrap_model
from phalanx.checkpoint import Checkpointer
from phalanx.checkpoint.resume import load_checkpoint
from phalanx.train.tp_plan import resolve_plan
print(sorted(name for name in {SHARDING!r} if name in sys.modules))
"""


def test_the_trainer_and_checkpointer_import_no_sharding_module() -> None:
    result = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
