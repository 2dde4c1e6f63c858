"""Runs of ckpt_worker.py on 2 ranks, and what the checkpoint tests read back from their run
directories (the distributed layer's reference runs and several test files share them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.support.procs import VENV_BIN, run

WORKER = str(Path(__file__).parent / "ckpt_worker.py")
COMMON = (
    "train.max_steps=12", "checkpoint.every_steps=4", "data.num_workers=2", "data.batch_size=4",
    "train.log_every=4", "train.progress=false",
)  # fmt: skip
"""12 steps (one epoch at 2 ranks), full checkpoints at 4, 8 and 12, 2 loader workers."""


def launch(
    run_dir: Path, *overrides: str, ranks: int = 2, run_args: tuple[str, ...] = ()
) -> tuple[int, str]:
    """`phalanx run` of ckpt_worker with COMMON then `overrides`: exit code, stderr's tail."""
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), *run_args, WORKER,
         f"run.dir={run_dir}", *COMMON, *overrides],
        timeout=240,
    )  # fmt: skip
    return result.returncode, result.stderr[-8000:]


def reference_run(tmp_path: Path, *overrides: str) -> Path:
    """An uninterrupted run: its run directory (final.pt, ids, checkpoints)."""
    run_dir = tmp_path / "reference"
    code, err = launch(run_dir, *overrides)
    assert code == 0, err
    return run_dir


def load(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


def steps_to_ids(run_dir: Path, rank: int) -> dict[int, list[int]]:
    """The sample ids each step trained on, the LAST record of a step winning (a re-run)."""
    lines = (run_dir / f"ids-rank-{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r["ids"] for r in map(json.loads, lines)}


def committed_steps(checkpoints: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in checkpoints.glob("step-*/meta.json"))


def assert_same_training(run_dir: Path, reference: Path) -> None:
    """Bitwise the same final model, and every step on the same samples, as `reference`."""
    final, expected = load(run_dir / "final.pt"), load(reference / "final.pt")
    assert final.keys() == expected.keys()
    for name in expected:
        assert torch.equal(final[name], expected[name]), name  # bitwise
    for rank in (0, 1):  # no sample repeated or skipped over both parts
        assert steps_to_ids(run_dir, rank) == steps_to_ids(reference, rank)
