"""One small interface for every tracker, and the set the Trainer talks to.

Exactly-once after a resume: a resumed run re-runs the steps after its checkpoint, so records
logged for them before the crash must not survive. Trackers that can take records back
(`rewinds`: JSONL rewrites its file, TensorBoard purges by step) log at once and drop what
follows the resume step when they start. Append-only trackers (wandb, MLflow keep every value
they were sent) are sent a record only once it is durable: covered by a committed checkpoint,
or the run has ended. Without a checkpoint store nothing can be re-run, so they log at once.
A crash can also lose what an append-only tracker buffered (wandb writes its file every few
seconds): on a resume each one is replayed, from the JSONL history, the records after the last
step it reports as persisted, up to the resume step.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("phalanx.track")


class Tracker(Protocol):
    name: str
    rewinds: bool
    """Can drop records after a step when a resumed run starts (so it may log at once)."""

    def start(self, *, resume_step: int, run_id: str | None) -> str | None:
        """Open (or continue, given `run_id`) the run; returns the id to keep, if any."""

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        """Record the Trainer's record `values` (numbers, some text) at optimizer step `step`;
        trackers that take numbers only filter it with `numeric()`."""

    def finish(self) -> None:
        """Flush and close; the run is complete."""

    def persisted_through(self) -> int:
        """Append-only trackers: the last step the backend has stored (0: none known)."""


def numeric(values: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record (step and time are the record's keys, not metrics)."""
    out = {}
    for key, value in values.items():
        if key in ("step", "time") or isinstance(value, str):
            continue
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[key] = float(value)
    return out


@dataclass
class Tracking:
    """The trackers of this rank (none on ranks that do not log)."""

    trackers: list[Tracker]
    ids_file: Path | None = None
    """Where this rank keeps tracker run ids, so a requeued job continues the same runs."""
    live: bool = False
    """Send append-only trackers every record at once (nothing can be re-run)."""
    _pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def start(self, *, resume_step: int, history: Callable[[], list[dict[str, Any]]]) -> None:
        """Open every tracker; `history()` gives the records kept so far (for replays)."""
        ids = self._read_ids()
        for tracker in self.trackers:
            run_id = tracker.start(resume_step=resume_step, run_id=ids.get(tracker.name))
            if run_id is not None:
                ids[tracker.name] = run_id
        if ids and self.ids_file is not None:
            self.ids_file.write_text(json.dumps(ids, indent=2) + "\n")
        replaying = [t for t in self.trackers if not t.rewinds and resume_step > 0]
        records = history() if replaying else []
        for tracker in replaying:
            done = tracker.persisted_through()
            for record in records:
                if done < int(record.get("step", 0)) <= resume_step:
                    tracker.log(int(record["step"]), record)

    def _read_ids(self) -> dict[str, str]:
        if self.ids_file is None or not self.ids_file.is_file():
            return {}
        try:
            loaded = json.loads(self.ids_file.read_text())
        except json.JSONDecodeError:
            log.warning("ignoring unreadable %s: trackers start new runs", self.ids_file)
            return {}
        return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}

    def log(self, values: Mapping[str, Any]) -> None:
        """A training or evaluation record; `values["step"]` is its optimizer step."""
        step, metrics = int(values["step"]), dict(values)
        for tracker in self.trackers:
            if tracker.rewinds or self.live:
                tracker.log(step, metrics)
        if not self.live:
            self._pending.append((step, metrics))

    def durable(self, step: int) -> None:
        """A checkpoint of `step` is committed: records up to it can no longer be re-run."""
        ready = [(s, m) for s, m in self._pending if s <= step]
        self._pending = [(s, m) for s, m in self._pending if s > step]
        self._send(ready)

    def finish(self) -> None:
        """The run ended (completed, or stopped for good): send everything, close."""
        ready, self._pending = self._pending, []
        self._send(ready)
        for tracker in self.trackers:
            tracker.finish()

    def _send(self, records: list[tuple[int, dict[str, Any]]]) -> None:
        for tracker in self.trackers:
            if not tracker.rewinds:
                for step, metrics in records:
                    tracker.log(step, metrics)

    def abandon(self) -> None:
        """After a crash: close without sending what a resume will train again."""
        self._pending = []
        for tracker in self.trackers:
            tracker.finish()
