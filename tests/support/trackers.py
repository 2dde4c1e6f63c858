"""Read tracker output back the way each tool would show it (for tests only).

wandb: offline `.wandb` files are a LevelDB-style log of protobuf records (32 KiB blocks, 7-byte
chunk headers with CRC32). Several files of one run id (a restarted job) are merged the way
`wandb sync` + the server treat them: in time order, a step lower than one already stored is
dropped, the same step merges.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


def _chunks(data: bytes) -> Iterator[bytes]:
    pos, pending = HEADER, b""  # the file starts with ':W&B' + version
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # block trailer padding
            pos += BLOCK - pos % BLOCK
            continue
        crc, size, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + size]
        if len(chunk) < size or zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            return  # a torn tail (the writer was killed)
        pos += HEADER + size
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def read_wandb_file(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    """(history rows, config, run info) of one offline `.wandb` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    rows: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    info: dict[str, str] = {}

    def key(item: Any) -> str:
        return str(item.key or "/".join(item.nested_key))

    for raw in _chunks(data):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "run":
            run = record.run
            info = {"id": run.run_id, "group": run.run_group, "name": run.display_name}
            config.update({key(i): json.loads(i.value_json) for i in run.config.update})
        elif kind == "config":
            config.update({key(i): json.loads(i.value_json) for i in record.config.update})
    config.pop("_wandb", None)
    return rows, config, info


def wandb_runs(root: Path) -> dict[str, list[Path]]:
    """run id -> its offline files in time order (one per process that logged to it)."""
    runs: dict[str, list[Path]] = {}
    for folder in sorted((root / "wandb").glob("offline-run-*")):
        for file in folder.glob("run-*.wandb"):
            runs.setdefault(file.stem[4:], []).append(file)
    return runs


def wandb_history(files: list[Path]) -> dict[int, dict[str, Any]]:
    """step -> row, merged as the wandb server would (lower steps after a higher one drop)."""
    merged: dict[int, dict[str, Any]] = {}
    for file in files:
        last = max(merged, default=0)
        for row in read_wandb_file(file)[0]:
            step = int(row["_step"])
            if step < last:
                continue
            merged.setdefault(step, {}).update(row)
            last = step
    return merged


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


@contextlib.contextmanager
def _file_store() -> Iterator[None]:
    """MLflow 3 opens a file store only with this variable; set it for the read, then undo."""
    before = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["MLFLOW_ALLOW_FILE_STORE"]
        else:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = before


def mlflow_runs(run_dir: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    with _file_store():
        client = MlflowClient(tracking_uri=f"file://{run_dir / 'mlruns'}")
        ids = [e.experiment_id for e in client.search_experiments()]
        return list(client.search_runs(ids)) if ids else []


def mlflow_history(run_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    with _file_store():
        client = MlflowClient(tracking_uri=f"file://{run_dir / 'mlruns'}")
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
