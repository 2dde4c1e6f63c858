"""The run directory: one resumable home per run, found again after a requeue.

    <root>/<name>-<id>/
      config.yaml        resolved config (written once, by the resolving process)
      diagnostics/       versions, hosts, GPUs, git commit + diff, launcher variables (redacted)
      logs/rank-K.log    per-rank log
      checkpoints/       step-N/ checkpoints; metrics.jsonl, plots/ (tracking)
      status.json        where training stands (rank 0, each logging point): `phalanx top`
      model/             a Hugging Face model's config.json (and a peft model's
                         adapter_config.json): what `phalanx export --format peft` rebuilds

Naming, in order: `run.dir` when set (a launcher resolved it, or the user continues a run);
`<name>-<SLURM_JOB_ID>` inside a SLURM job, so a requeued job (same id) finds its directory;
else `<name>-<UTC time>` created exclusively, with `-2`, `-3`... when two runs start in the same
second, so a new run never writes into an old one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from phalanx.errors import UsageError

CONFIG_FILE = "config.yaml"
MODEL_DIR = "model"


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory."""

    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def diagnostics(self) -> Path:
        return self.path / "diagnostics"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    def log_file(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def ensure(self) -> RunDir:
        """Create the fixed sub-folders (idempotent: every rank may call it)."""
        with writable("the run directory", self.path):
            for folder in (self.path, self.diagnostics, self.logs):
                folder.mkdir(parents=True, exist_ok=True)
        return self


@contextlib.contextmanager
def writable(what: str, path: Path) -> Iterator[None]:
    """A storage error inside (no permission, a file where a folder goes, a name with a '/')
    as a one-line UsageError: these are the user's paths, not phalanx's failures."""
    try:
        yield
    except OSError as error:
        raise storage_error(what, path, error) from None


def storage_error(what: str, path: Path, error: OSError) -> UsageError:
    where = error.filename or path
    return UsageError(
        f"cannot write {what} '{where}': {error.strerror or error}; set run.root (or run.dir) "
        "to a folder you can write"
    )


def job_dir(root: Path, name: str, environ: Mapping[str, str]) -> Path | None:
    """`<root>/<name>-<SLURM_JOB_ID>` inside a SLURM job, else None."""
    job = environ.get("SLURM_JOB_ID")
    return root / f"{name}-{job}" if job else None


def create_fresh(root: Path, name: str, now: datetime | None = None) -> Path:
    """Create a new, empty run directory atomically (mkdir fails if the name is taken)."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"cannot create run root '{root}': {error.strerror}; set run.root"
        ) from None
    for attempt in range(1, 1000):
        path = root / (f"{name}-{stamp}" if attempt == 1 else f"{name}-{stamp}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as error:  # no permission, or a '/' in the name
            raise storage_error("the run directory", path, error) from None
        return path
    raise UsageError(f"could not find a free run directory name under '{root}'")


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary name, fsync, rename: readers see the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
