"""A sweep file: the script, the parameters to vary, the metric to rank trials by.

    # sweep.yaml
    name: lr-bs
    script: train.py
    args: [--config, base.yaml]          # fixed arguments (optional)
    method: grid                         # or random (then `trials: N`, `seed: S`)
    parameters:
      train.lr: [0.01, 0.001]            # a list: these values
      data.batch_size: [8, 16]
      train.weight_decay: {min: 1.0e-5, max: 1.0e-2, log: true}   # random only: a range
    metric: eval/accuracy
    mode: max
    ranks: 2                             # processes per trial

Trials are independent runs (one job array task each on SLURM), never ranks of one job.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.config.loader import read_yaml
from phalanx.errors import UsageError

KEYS = {"name", "script", "args", "method", "trials", "seed", "parameters", "metric", "mode",
        "ranks"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    name: str
    script: Path
    args: tuple[str, ...]
    method: str
    trials: int
    seed: int
    parameters: dict[str, Any]
    metric: str
    mode: str
    ranks: int

    def __post_init__(self) -> None:
        if self.method not in ("grid", "random"):
            raise UsageError(f"sweep method={self.method!r} is not one of: grid, random")
        if self.mode not in ("min", "max"):
            raise UsageError(f"sweep mode={self.mode!r} is not one of: min, max")
        if not self.parameters:
            raise UsageError("sweep has no parameters: give section.key: [values] entries")
        for key, values in self.parameters.items():
            _check_parameter(key, values, self.method)
        if self.method == "random" and self.trials < 1:
            raise UsageError("a random sweep needs trials: N (N >= 1)")
        if self.ranks < 1:
            raise UsageError(f"sweep ranks={self.ranks} must be >= 1")
        if not self.script.is_file():
            raise UsageError(f"sweep script '{self.script}' not found")


def _check_parameter(key: str, values: Any, method: str) -> None:
    if "." not in key:
        raise UsageError(f"sweep parameter {key!r} must be a dotted config key (train.lr)")
    if isinstance(values, list) and values:
        return
    if method == "random" and isinstance(values, Mapping) and {"min", "max"} <= set(values):
        low, high = (values[end] for end in ("min", "max"))
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
            raise UsageError(f"sweep parameter {key}: min and max must be numbers")
        if values.get("log") and not (low > 0 and high > 0):
            raise UsageError(f"sweep parameter {key}: a log range needs min > 0 and max > 0")
        return
    allowed = "a non-empty list" + (" or {min, max, log}" if method == "random" else "")
    raise UsageError(f"sweep parameter {key}: give {allowed}")


def load_spec(path: Path) -> SweepSpec:
    data = read_yaml(path)
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise UsageError(f"sweep file {path}: unknown keys {unknown} (known: {sorted(KEYS)})")
    for key in ("script", "metric"):
        if key not in data:
            raise UsageError(f"sweep file {path} needs {key}:")
    script = Path(str(data["script"]))
    if not script.is_absolute() and not script.exists():
        script = path.parent / script  # relative to the sweep file
    args, parameters = data.get("args", []), data.get("parameters") or {}
    if not isinstance(args, list):
        raise UsageError(f"sweep file {path}: args must be a list (args: [--config, base.yaml])")
    if not isinstance(parameters, Mapping):
        raise UsageError(f"sweep file {path}: parameters must map section.key: [values]")
    return SweepSpec(
        name=str(data.get("name", path.stem)), script=script, args=tuple(str(a) for a in args),
        method=str(data.get("method", "grid")), trials=_whole(data, "trials", 0, path),
        seed=_whole(data, "seed", 0, path), parameters=dict(parameters),
        metric=str(data["metric"]), mode=str(data.get("mode", "min")),
        ranks=_whole(data, "ranks", 1, path),
    )  # fmt: skip


def _whole(data: Mapping[str, Any], key: str, default: int, path: Path) -> int:
    value = data.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise UsageError(f"sweep file {path}: {key} must be a whole number (got {value!r})")


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """The trials: every combination (grid), or `trials` draws seeded by `seed` (random)."""
    keys = sorted(spec.parameters)
    if spec.method == "grid":
        combos = itertools.product(*(spec.parameters[k] for k in keys))
        return [dict(zip(keys, combo, strict=True)) for combo in combos]
    rng = random.Random(spec.seed)
    return [{k: _draw(rng, spec.parameters[k]) for k in keys} for _ in range(spec.trials)]


def _draw(rng: random.Random, values: Any) -> Any:
    if isinstance(values, list):
        return rng.choice(values)
    low, high = float(values["min"]), float(values["max"])
    if values.get("log"):
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    return rng.uniform(low, high)


def overrides(trial: Mapping[str, Any]) -> list[str]:
    """A trial as config overrides (section.key=value)."""
    return [f"{key}={_text(value)}" for key, value in sorted(trial.items())]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)
