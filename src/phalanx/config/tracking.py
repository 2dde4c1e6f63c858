"""The `track` config section: where metrics go (phalanx.track)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from phalanx.config.schema import check_choice
from phalanx.errors import UsageError

TRACKERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
TRACKER_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}
"""Optional packages: (module, pip name)."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: blocked with sys.modules[name] = None
        return False


@dataclass(frozen=True, kw_only=True)
class TrackConfig:
    """Experiment trackers (see docs/tracking.md)."""

    trackers: tuple[str, ...] = ("console", "jsonl")
    """Where metrics go: console, jsonl (+ metrics.csv), tensorboard, wandb, mlflow."""
    all_ranks: bool = False
    """Every rank logs (its own files / runs, grouped by job); default: rank 0 only."""
    project: str = "phalanx"
    """wandb project and MLflow experiment name."""
    wandb_mode: str = ""
    """wandb mode: online, offline or disabled (empty: wandb's own default, e.g. WANDB_MODE)."""
    mlflow_uri: str = ""
    """MLflow tracking URI (empty: the file store `<run dir>/mlruns`; or http://server:5000)."""
    plots: bool = True
    """Write plots/*.png at the end of training (needs matplotlib)."""

    def __post_init__(self) -> None:
        for name in self.trackers:
            check_choice("track.trackers item", name, TRACKERS)
            module, package = TRACKER_PACKAGES.get(name, (None, None))
            if module is not None and not _importable(module):
                raise UsageError(
                    f"tracker {name!r} needs the {package} package: pip install {package} "
                    f"(or drop {name} from track.trackers)"
                )
        if len(set(self.trackers)) != len(self.trackers):
            raise UsageError(f"config track.trackers={list(self.trackers)} names one twice")
        if self.wandb_mode:
            check_choice("track.wandb_mode", self.wandb_mode, ("online", "offline", "disabled"))
