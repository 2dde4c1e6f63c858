"""One resumable home per run: naming, creation, config.yaml, diagnostics, per-rank logs."""

from phalanx.rundir.layout import RunDir
from phalanx.rundir.resolve import parse_config

__all__ = ["RunDir", "parse_config"]
