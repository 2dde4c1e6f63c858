"""PNG curves: the end-of-run plots of one run, and `phalanx plot` overlaying several runs.

One figure per group of metrics: training loss, evaluation metrics, throughput. A run is read
from its metrics.jsonl (the JSONL tracker), so plots work for finished, resumed and running runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from phalanx.errors import UsageError
from phalanx.track.base import numeric
from phalanx.track.files import read_records

log = logging.getLogger("phalanx.track")
SKIP = {"epoch", "lr", "nonfinite_steps", "scaler_skips", "samples"}
THROUGHPUT = ("samples_per_s", "tokens_per_s", "mfu", "step_time_s")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on cluster nodes
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("plots need matplotlib: pip install matplotlib") from None
    return plt


def series(records: Sequence[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (steps, values), in step order, each step once (the last record wins)."""
    by_key: dict[str, dict[int, float]] = {}
    for record in records:
        step = int(record.get("step", 0))
        for key, value in numeric(record).items():
            if key not in SKIP:
                by_key.setdefault(key, {})[step] = value
    return {k: (sorted(v), [v[s] for s in sorted(v)]) for k, v in by_key.items()}


def groups(keys: Sequence[str]) -> dict[str, list[str]]:
    out = {
        "loss": [k for k in keys if "loss" in k and not k.startswith("eval/")],
        "eval": [k for k in keys if k.startswith("eval/")],
        "throughput": [k for k in keys if k in THROUGHPUT],
    }
    return {name: sorted(found) for name, found in out.items() if found}


def plot_runs(run_dirs: Sequence[Path], out_dir: Path) -> list[Path]:
    """One PNG per metric group, every run's curve on it; returns the files written."""
    plt = _pyplot()
    names = [d.name for d in run_dirs]
    labels = names if len(set(names)) == len(names) else [str(d) for d in run_dirs]
    runs = {}
    for label, run_dir in zip(labels, run_dirs, strict=True):
        records = read_records(run_dir / "metrics.jsonl")
        if not records:
            raise UsageError(f"{run_dir} has no metrics.jsonl records to plot (a run directory?)")
        runs[label] = series(records)
    keys = sorted({k for data in runs.values() for k in data})
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, names in groups(keys).items():
        fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.6 * len(names)), squeeze=False)
        for ax, name in zip(axes[:, 0], names, strict=True):
            for label, data in runs.items():
                if name in data:
                    ax.plot(*data[name], label=label, marker="." if len(data[name][0]) < 30 else "")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        axes[-1, 0].set_xlabel("step")
        if len(runs) > 1:
            axes[0, 0].legend(fontsize="small")
        fig.tight_layout()
        path = out_dir / f"{group}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def end_of_run_plots(run_dir: Path) -> list[Path]:
    """The run's own plots into <run dir>/plots; a missing matplotlib is a warning here."""
    try:
        return plot_runs([run_dir], run_dir / "plots")
    except UsageError as error:
        log.warning("no plots: %s", error)
        return []
