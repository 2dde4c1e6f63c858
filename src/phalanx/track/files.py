"""The JSONL tracker: one JSON record per logging point, rewritten on resume; CSV at the end."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file (a torn last line from a crash is skipped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class JsonlTracker:
    """metrics.jsonl (every value, strings too) and, when the run ends, metrics.csv."""

    name = "jsonl"
    rewinds = True

    def __init__(self, path: Path) -> None:
        self.path = path

    def start(self, *, resume_step: int, run_id: str | None) -> None:
        del run_id
        if not self.path.exists():
            return
        # Steps after the resume point are trained again: their old records go.
        kept = [r for r in read_records(self.path) if int(r.get("step", 0)) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, self.path)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        del step  # part of the record
        with open(self.path, "a") as handle:
            handle.write(json.dumps(dict(values)) + "\n")

    def persisted_through(self) -> int:
        return 0  # rewinds instead

    def finish(self) -> None:
        # One column per scalar: nested values (per-phase and per-rank times) stay in the JSONL.
        records = [
            {k: v for k, v in r.items() if not isinstance(v, (dict, list))}
            for r in read_records(self.path)
        ]
        if not records:
            return
        columns = list(dict.fromkeys(key for record in records for key in record))
        target = self.path.with_suffix(".csv")
        tmp = target.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(records)
        os.replace(tmp, target)
