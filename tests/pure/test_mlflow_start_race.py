"""MLflow: trackers of one job that start at the same moment (track.all_ranks) share one
experiment; the one that loses the race to create it uses the winner's (real file store)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from phalanx.track.external import MlflowTracker


def test_trackers_starting_together_all_get_runs_in_one_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the tracker and MLflow set in os.environ is undone after the test.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("_MLFLOW_TELEMETRY_SESSION_ID", "test")
    ranks = 8
    uri = (tmp_path / "mlruns").as_uri()
    trackers = [
        MlflowTracker(uri=uri, experiment="phalanx", name=f"run-rank{r}", config={}, tags={})
        for r in range(ranks)
    ]
    gate, errors = threading.Barrier(ranks), []

    def start(tracker: MlflowTracker) -> None:
        gate.wait(timeout=30)  # every "rank" checks for the experiment at the same time
        try:
            tracker.start(resume_step=0, run_id=None)
        except Exception as error:  # collected: a thread's exception would be lost
            errors.append(error)

    threads = [threading.Thread(target=start, args=(t,)) for t in trackers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    experiments = {t.client.get_run(t.run_id).info.experiment_id for t in trackers}
    assert len(experiments) == 1 and all(t.run_id for t in trackers)
