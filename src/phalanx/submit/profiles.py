"""Cluster profiles: named presets in one YAML file, merged as defaults < file < profile < flags.

# ~/.config/phalanx/profiles.yaml (or $PHALANX_PROFILES, or --profiles FILE)
mycluster:
  job: {partition: gpu, account: proj123, gpus_per_node: 4, time: "12:00:00"}
  env: {kind: modules, modules: [cuda/12.4, python/3.11]}
  launch: {mode: torchrun}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from phalanx.config.coerce import build
from phalanx.config.loader import merge, parse_override, read_yaml
from phalanx.errors import UsageError
from phalanx.submit.config import SubmitConfig, with_absolute_paths


def profiles_path(explicit: str | None, environ: Mapping[str, str]) -> Path:
    if explicit:
        return Path(explicit)
    if environ.get("PHALANX_PROFILES"):
        return Path(environ["PHALANX_PROFILES"])
    home = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return home / "phalanx" / "profiles.yaml"


def read_profile(path: Path, name: str) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"profile {name!r} asked for, but there is no profiles file {path}")
    profiles = read_yaml(path)
    if name not in profiles:
        known = ", ".join(sorted(profiles)) or "none"
        raise UsageError(f"unknown profile {name!r} in {path} (known: {known})")
    profile = profiles[name]
    if not isinstance(profile, dict):
        raise UsageError(f"profile {name!r} in {path} must be a mapping of sections")
    return profile


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        both = isinstance(below, Mapping) and isinstance(value, Mapping)
        out[key] = deep_merge(below, value) if both else value  # type: ignore[arg-type]
    return out


def resolve_submit_config(
    *,
    config_file: str | None,
    profile: str | None,
    profiles_file: str | None,
    overrides: Iterable[str],
    environ: Mapping[str, str],
    base: Path | None = None,
) -> SubmitConfig:
    """defaults < config file < profile < overrides (flags become overrides too); relative
    paths in any of them are taken from `base` (default: the current directory)."""
    data: dict[str, Any] = read_yaml(config_file) if config_file else {}
    if profile:
        data = deep_merge(data, read_profile(profiles_path(profiles_file, environ), profile))
    for token in overrides:
        path, value = parse_override(token, SubmitConfig)
        data = merge(data, path, value)
    _refuse_yaml_number_time(data)  # overrides are text: a number left came from a file
    return with_absolute_paths(build(SubmitConfig, data), base or Path.cwd())


def _refuse_yaml_number_time(data: Mapping[str, Any]) -> None:
    """YAML reads an unquoted `time: 12:00:00` as the base-60 number 43200, which SLURM would
    take as 43,200 minutes: a job time from a file must be quoted text."""
    job = data.get("job")
    time = job.get("time") if isinstance(job, Mapping) else None
    if isinstance(time, int) and not isinstance(time, bool):
        raise UsageError(
            f"submit job.time in a YAML file reads as the number {time}; quote it "
            '(time: "12:00:00", or "60" for minutes)'
        )
