"""A 4-trial grid sweep over the checkpoint test worker, and the check of its summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

WORKER = Path(__file__).parent / "ckpt_worker.py"
SPEC = {
    "name": "grid",
    "script": str(WORKER),
    "args": ["train.max_steps=4", "data.batch_size=4", "train.log_every=2",
             "train.progress=false", "checkpoint.every_steps=0", "data.num_workers=0"],
    "method": "grid",
    "parameters": {"train.clip_grad_norm": [0.5, 0.01], "train.seed": [1, 2]},
    "metric": "loss",
    "mode": "min",
    "ranks": 1,
}  # fmt: skip


def write_spec(folder: Path) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def check_summary(sweep_dir: Path, printed: str) -> list[dict[str, Any]]:
    """Every trial ran its own parameters; the table is sorted by each trial's last loss."""
    rows = json.loads((sweep_dir / "summary.json").read_text())
    assert len(rows) == 4
    combos = set()
    for row in rows:
        trial_dir = sweep_dir / f"trial-{row['trial']}"
        config = yaml.safe_load((trial_dir / "config.yaml").read_text())
        assert config["train"]["clip_grad_norm"] == row["train.clip_grad_norm"]
        assert config["train"]["seed"] == row["train.seed"]
        losses = [json.loads(line)["loss"] for line in (trial_dir / "metrics.jsonl").open()
                  if "loss" in json.loads(line)]  # fmt: skip
        assert row["loss"] == losses[-1] and row["ended"] is True
        combos.add((row["train.clip_grad_norm"], row["train.seed"]))
    assert combos == {(0.5, 1), (0.5, 2), (0.01, 1), (0.01, 2)}
    assert [r["loss"] for r in rows] == sorted(r["loss"] for r in rows)
    table = printed.splitlines()[-5:]  # the header and one line per trial, best first
    assert table[0].split() == ["trial", "train.clip_grad_norm", "train.seed", "loss", "ended"]
    assert [int(line.split()[0]) for line in table[1:]] == [r["trial"] for r in rows]
    return list(rows)
