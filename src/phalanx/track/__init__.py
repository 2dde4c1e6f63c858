"""Experiment tracking: JSONL (+CSV), TensorBoard, wandb, MLflow behind one interface; plots."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phalanx.config.training import TrackConfig
from phalanx.env import ClusterEnv
from phalanx.track.base import Tracker, Tracking, numeric
from phalanx.track.external import MlflowTracker, TensorBoardTracker, WandbTracker
from phalanx.track.files import JsonlTracker, read_records

__all__ = ["Tracker", "Tracking", "numeric", "open_tracking", "read_records"]


def flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: hyperparameters as trackers show them."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def open_tracking(
    config: TrackConfig,
    *,
    run_dir: Path | None,
    env: ClusterEnv,
    hyperparameters: Mapping[str, Any],
    live: bool,
) -> Tracking:
    """This rank's trackers: rank 0's, or every rank's with `all_ranks` (own files and runs)."""
    if run_dir is None or not (env.is_main_process or config.all_ranks):
        return Tracking([])
    suffix = f"-rank-{env.rank}" if env.rank else ""
    per_rank = config.all_ranks
    params = flat(hyperparameters)
    trackers: list[Tracker] = []
    for name in config.trackers:
        if name == "jsonl":
            trackers.append(JsonlTracker(run_dir / f"metrics{suffix}.jsonl"))
        elif name == "tensorboard":
            tb = run_dir / "tensorboard"
            trackers.append(TensorBoardTracker(tb / f"rank-{env.rank}" if per_rank else tb))
        elif name == "wandb":
            trackers.append(WandbTracker(
                root=run_dir, project=config.project, name=f"{run_dir.name}{suffix}",
                group=run_dir.name if per_rank else None, mode=config.wandb_mode, config=params,
            ))  # fmt: skip
        elif name == "mlflow":
            trackers.append(MlflowTracker(
                uri=config.mlflow_uri or f"file://{run_dir / 'mlruns'}",
                experiment=config.project, name=f"{run_dir.name}{suffix}", config=params,
                tags={"rank": str(env.rank), "job": env.job_id or ""},
            ))  # fmt: skip
    return Tracking(trackers, ids_file=run_dir / f"tracking{suffix or '-rank-0'}.json", live=live)
