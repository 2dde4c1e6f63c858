"""Resolve a config once and give it a run directory.

`phalanx run` calls the script with `--phalanx-resolve`: the script's `parse_config` validates
the config, creates the run directory, writes `config.yaml` there and exits before any worker
starts. The workers then get `--config <run dir>/config.yaml`: the same bytes, through a file and
argv, never through environment variables.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from phalanx.config.args import parse_args
from phalanx.config.loader import dump
from phalanx.config.schema import Config
from phalanx.env.spawned import refuse_spawned_import
from phalanx.errors import UsageError
from phalanx.rundir.layout import RunDir, create_fresh, job_dir, writable, write_atomic

C = TypeVar("C", bound=Config)
RUN_DIR_LINE = "phalanx-run-dir: "
log = logging.getLogger(__name__)


def choose_dir(config: Config, environ: Mapping[str, str], *, create: bool) -> Path | None:
    """The run directory for `config`; None when only a creating process may choose it."""
    run = config.run
    if run.dir:
        return Path(run.dir)
    if run.dry_run:
        return Path(tempfile.mkdtemp(prefix=f"phalanx-dry-run-{run.name}-")) if create else None
    found = job_dir(Path(run.root), run.name, environ)
    if found is not None:
        return found
    return create_fresh(Path(run.root), run.name) if create else None


def with_dir(config: C, path: Path) -> C:
    """The config with `run.dir` filled in (absolute, so every node and cwd agree)."""
    run = dataclasses.replace(config.run, dir=str(path.resolve()))
    return dataclasses.replace(config, run=run)


def write_config(config: Config, run_dir: RunDir) -> None:
    """Write config.yaml unless it already holds these bytes; keep a changed one's old copy."""
    with writable("the run's config", run_dir.config_file):
        _write_config(dump(config), run_dir.config_file)


def _write_config(text: str, target: Path) -> None:
    if target.exists():
        old = target.read_text()
        if old == text:
            return
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        write_atomic(target.with_name(f"config-before-{stamp}.yaml"), old)
        log.warning("config differs from %s; the previous one is kept beside it", target)
    write_atomic(target, text)


def parse_config(cls: type[C], argv: Sequence[str] | None = None) -> C:
    """Parse a script's command line into `cls`; one-line error and exit 2 on bad input.

    Under `phalanx run` (the resolve flag) this also creates the run directory, writes
    config.yaml, prints its path and exits, so the launcher can start the workers with it.
    """
    refuse_spawned_import()  # before argv, which is the spawned process's own
    try:
        parsed = parse_args(cls, argv)
        if not parsed.resolve_only:
            return parsed.config
        path = choose_dir(parsed.config, os.environ, create=True)
        assert path is not None
        config = with_dir(parsed.config, path)
        run_dir = RunDir(Path(config.run.dir)).ensure()
        write_config(config, run_dir)
    except UsageError as error:
        print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{RUN_DIR_LINE}{run_dir.path}", flush=True)
    raise SystemExit(0)
