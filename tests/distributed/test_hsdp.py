"""HSDP (`train.strategy=hsdp`) on 4 gloo ranks as 2 replicas x 2 shards: training equal to DDP,
and checkpoints that move between meshes and world sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import VENV_BIN, run

WORKER = str(Path(__file__).parents[1] / "support" / "hsdp_worker.py")
pytestmark = pytest.mark.dist


def scenario(out: Path, name: str, ranks: int) -> dict[str, Any]:
    result = run([str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), WORKER, name, str(out)],
                 timeout=200)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hsdp mesh: 2 replicas x 2 shards (shard groups: ranks 0-1, 2-3;" in result.stderr
    return json.loads((out / f"{name}.json").read_text())  # type: ignore[no-any-return]


def max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.timeout(240)
def test_hsdp_2x2_trains_like_ddp(tmp_path: Path) -> None:
    # 6 AdamW steps of 2 micro-batches, clipping active (the gradient norm of a 2-D mesh's
    # DTensors, made whole), evaluation in lock step; an instance and a meta-device factory.
    r = scenario(tmp_path, "parity", 4)
    ddp = r["ddp"]
    assert len(ddp["losses"]) == 6 and min(ddp["grad_norms"]) > 0.3  # clipping did something
    for name in ("hsdp", "hsdp_factory"):
        hsdp = r[name]
        assert hsdp["placements"] == ["R", "S(0)"], name  # replicated x sharded
        assert max_diff(ddp["losses"], hsdp["losses"]) < 1e-5, name
        assert max_diff(ddp["grad_norms"], hsdp["grad_norms"]) < 1e-4, name
        assert max_diff(ddp["params"], hsdp["params"]) < 1e-6, name
        assert max_diff(ddp["eval"], hsdp["eval"]) < 1e-5, name
    # init_weights draws each shard from seed + its place in the shard group: the two replicas
    # of a shard (ranks 0 and 2, 1 and 3) start equal.
    shards = r["custom"]
    assert shards[0] == shards[2] and shards[1] == shards[3] and shards[0] != shards[1]
