"""TensorBoard, wandb and MLflow behind the Tracker interface; each imports its package only
when chosen, and a missing package is a one-line error with the pip command."""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from phalanx.errors import UsageError
from phalanx.track.base import numeric

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


def need(module: str, tracker: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"tracker {tracker!r} needs the {PACKAGES[tracker]} package: pip install "
            f"{PACKAGES[tracker]} (or drop {tracker} from track.trackers)"
        ) from None


class TensorBoardTracker:
    """Scalars in event files; a resumed run purges the events after its resume step."""

    name = "tensorboard"
    rewinds = True

    def __init__(self, log_dir: Path) -> None:
        need("tensorboard", "tensorboard")
        self.log_dir = log_dir
        self._writer: Any = None

    def start(self, *, resume_step: int, run_id: str | None) -> None:
        del run_id
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: readers ignore earlier files' events from this step on.
        purge = resume_step + 1 if self.log_dir.exists() else None
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        for key, value in numeric(values).items():
            self._writer.add_scalar(key, value, global_step=step)

    def persisted_through(self) -> int:
        return 0  # rewinds instead

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbTracker:
    """One wandb run per logging rank, continued by id after a requeue."""

    name = "wandb"
    rewinds = False

    def __init__(self, *, root: Path, project: str, name: str, group: str | None, mode: str,
                 config: Mapping[str, Any]) -> None:  # fmt: skip
        self._wandb = need("wandb", "wandb")
        self.root, self.project, self.run_name, self.group = root, project, name, group
        self.mode, self.config = mode or None, dict(config)
        self._run: Any = None

    def start(self, *, resume_step: int, run_id: str | None) -> str:
        del resume_step  # wandb only ever received durable records (see Tracking)
        run_id = run_id or secrets.token_hex(4)  # wandb ids: short, lowercase
        self._run = self._wandb.init(
            project=self.project, dir=str(self.root), id=run_id, resume="allow",
            name=self.run_name, group=self.group, mode=self.mode, config=self.config,
        )  # fmt: skip
        return str(run_id)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        self._run.log(numeric(values), step=step)

    def persisted_through(self) -> int:
        # A resumed online run continues at the server's next step; an offline run starts a
        # new file (wandb sync keeps the first value of a step and drops lower steps).
        return max(int(self._run.step) - 1, 0) if self._run.resumed else 0

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()


class MlflowTracker:
    """An MLflow run (parameters once, metrics by step), continued by id after a requeue."""

    name = "mlflow"
    rewinds = False

    def __init__(self, *, uri: str, experiment: str, name: str, config: Mapping[str, Any],
                 tags: Mapping[str, str]) -> None:  # fmt: skip
        need("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        if uri.startswith("file:"):
            # MLflow 3 keeps its file store behind this switch; a run directory is the natural
            # local store (mlflow-skinny has no SQL backend). MLflow reads it from os.environ
            # whenever it builds a FileStore (no argument exists): scoping it would rest on its
            # private per-URI store cache, so it stays set for this process.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client, self.uri = MlflowClient(tracking_uri=uri), uri
        self.experiment, self.run_name = experiment, name
        self.config, self.tags = dict(config), dict(tags)
        self.run_id = ""

    def start(self, *, resume_step: int, run_id: str | None) -> str:
        del resume_step
        if run_id:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name, tags=self.tags)
        self.run_id = run.info.run_id
        self._log_params()
        return self.run_id

    def _experiment_id(self) -> str:
        """The experiment's id, created if missing. With track.all_ranks every rank gets here
        at once: a rank that loses the race to create it reads the winner's."""
        from mlflow.exceptions import MlflowException

        with _store_lock(self.uri):  # a file store does not refuse a second one of a name
            found = self.client.get_experiment_by_name(self.experiment)
            if found is not None:
                return str(found.experiment_id)
            try:
                return str(self.client.create_experiment(self.experiment))
            except MlflowException:  # a server's answer when another rank created it first
                found = self.client.get_experiment_by_name(self.experiment)
                if found is None:
                    raise
                return str(found.experiment_id)

    def _log_params(self) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in sorted(self.config.items())]
        for i in range(0, len(params), 100):  # MLflow's batch limit
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def persisted_through(self) -> int:
        """The highest step of any metric the store holds for this run (log_batch is
        synchronous: what returned is stored)."""
        history = self.client.get_metric_history
        keys = self.client.get_run(self.run_id).data.metrics
        return max((e.step for key in keys for e in history(self.run_id, key)), default=0)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in numeric(values).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self) -> None:
        if self.run_id:
            self.client.set_terminated(self.run_id, status="FINISHED")


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Exclusive between the processes and threads of this host that create an experiment in
    the same MLflow file store (a lock file beside the store); nothing for other stores."""
    if not uri.startswith("file:"):
        yield
        return
    store = Path(uri.removeprefix("file://").removeprefix("file:"))
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.parent / f".{store.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
