"""GPU worker: the Trainer with a model compiled into CUDA graphs (train.compile_mode).

    phalanx run -n N graphs_worker.py OUT MODE

Trains the same model twice, with train.compile_mode=default and with MODE, logging every 4th
step and evaluating every 4th, so the metrics hold several steps' losses and eval values when
the graphs replay. The model returns its loss (per-sample errors in eval), as GPT-style models
do, so the values the metrics keep are the graphs' own outputs. Rank 0 writes OUT/graphs.json:
both runs' logged losses and eval values.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from toy_models import WithLoss  # same folder: sys.path[0]
from trainer_common import config, regression_data

import phalanx


def logged(d: phalanx.Dist, mode: str) -> dict[str, Any]:
    cfg = config(
        "data.batch_size=8", "train.max_steps=12", "train.log_every=4", "train.eval_every=4",
        "train.compile=true", f"train.compile_mode={mode}",
    )  # fmt: skip
    trainer = phalanx.Trainer(
        d, config=cfg, model=WithLoss(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        train_data=regression_data(512), train_step=lambda model, batch: model(*batch),
        eval_data=regression_data(64), eval_step=lambda model, batch: {"sq_err": model(*batch)},
    )  # fmt: skip
    history = trainer.fit()
    return {
        "losses": [h["loss"] for h in history if "loss" in h],
        "eval": [h["eval/sq_err"] for h in history if "eval/sq_err" in h],
    }


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=120)) as d:
        result = {"default": logged(d, "default"), mode: logged(d, mode)}
        if d.env.is_main_process:
            (out / "graphs.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
