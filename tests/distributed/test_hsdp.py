"""HSDP (`train.strategy=hsdp`) on 4 gloo ranks as 2 replicas x 2 shards: training equal to DDP,
and checkpoints that move between meshes and world sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

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
    # DTensors, made whole), evaluation in lock step; an instance, a meta-device factory, and
    # gradients reduced after every micro-batch instead of once per step; train.compile=true
    # (each block's forward compiled before sharding; the 3 identical blocks share one graph
    # for training and one for evaluation, which runs under no_grad).
    r = scenario(tmp_path, "parity", 4)
    ddp = r["ddp"]
    assert len(ddp["losses"]) == 6 and min(ddp["grad_norms"]) > 0.3  # clipping did something
    assert not any(r["hsdp"]["compiled"]) and r["hsdp"]["graphs"] == 0
    assert r["hsdp_compile"]["compiled"] == [True] * 3 and r["hsdp_compile"]["graphs"] == 2
    for name in ("hsdp", "hsdp_factory", "hsdp_every", "hsdp_compile"):
        hsdp = r[name]
        assert hsdp["placements"] == ["R", "S(0)"], name  # replicated x sharded
        assert max_diff(ddp["losses"], hsdp["losses"]) < 1e-5, name
        assert max_diff(ddp["grad_norms"], hsdp["grad_norms"]) < 1e-4, name
        assert max_diff(ddp["params"], hsdp["params"]) < 1e-6, name
        assert max_diff(ddp["eval"], hsdp["eval"]) < 1e-5, name
    # bf16: parameters all-gathered in bf16, gradients reduced in fp32, the sharded weights
    # the optimizer steps stay fp32. Measured against fp32 DDP: losses within 8e-3 (relative
    # 2.8e-3), gradient norms 1.1e-2, weights 2e-3; differing at all shows bf16 was used.
    bf16 = r["hsdp_bf16"]
    assert bf16["placements"] == ["R", "S(0)"] and bf16["dtype"] == "torch.float32"
    assert bf16["losses"] == pytest.approx(ddp["losses"], rel=1e-2)
    assert bf16["grad_norms"] == pytest.approx(ddp["grad_norms"], rel=1e-2)
    assert 1e-5 < max_diff(ddp["params"], bf16["params"]) < 1e-2
    # init_weights draws each shard from seed + its place in the shard group: the two replicas
    # of a shard (ranks 0 and 2, 1 and 3) start equal.
    shards = r["custom"]
    assert shards[0] == shards[2] and shards[1] == shards[3] and shards[0] != shards[1]


CKPT_WORKER = str(Path(__file__).parents[1] / "support" / "ckpt_worker.py")
GLOBAL_BATCH = 8
COMMON = ("train.max_steps=12", "checkpoint.every_steps=4", "data.num_workers=0",
          "train.log_every=1", "train.progress=false", "checkpoint.sharded=true",
          "model.blocks=3", "train.clip_grad_norm=0.5")  # fmt: skip
STRATEGIES = {
    "fsdp": ("train.strategy=fsdp",),
    "hsdp": ("train.strategy=hsdp", "train.hsdp_shard_size=2"),
    "ddp": ("train.strategy=ddp",),
}


def launch(run_dir: Path, strategy: str, ranks: int, *overrides: str) -> str:
    """A ckpt_worker run with the same global batch on any number of ranks."""
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", str(ranks), CKPT_WORKER, f"run.dir={run_dir}",
         *COMMON, *STRATEGIES[strategy], f"data.batch_size={GLOBAL_BATCH // ranks}", *overrides],
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def global_batches(run_dir: Path) -> dict[int, list[int]]:
    """The sample ids of each step over all ranks."""
    steps: dict[int, list[int]] = {}
    for path in run_dir.glob("ids-rank-*.jsonl"):
        for record in map(json.loads, path.read_text().splitlines()):
            steps.setdefault(record["step"], []).extend(record["ids"])
    return {step: sorted(ids) for step, ids in steps.items()}


def assert_continues(run_dir: Path, reference: Path, first: int) -> None:
    """Steps first..12 on the same samples with the same losses, and the same final model, as
    the uninterrupted run (to float tolerance: reduction orders differ between meshes)."""
    ids, expected_ids = global_batches(run_dir), global_batches(reference)
    assert sorted(ids) == list(range(first, 13))
    assert ids == {step: expected_ids[step] for step in ids}
    found, expected = losses(run_dir), losses(reference)
    assert sorted(found) == list(range(first, 13))
    for step, loss in found.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    final = torch.load(run_dir / "final.pt", weights_only=True)
    reference_final = torch.load(reference / "final.pt", weights_only=True)
    assert final.keys() == reference_final.keys()
    for name, tensor in reference_final.items():
        torch.testing.assert_close(final[name], tensor, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted FSDP run on 2 ranks: checkpoints at steps 4, 8 and 12."""
    run_dir = tmp_path_factory.mktemp("hsdp_resume") / "reference"
    launch(run_dir, "fsdp", 2)
    return run_dir


@pytest.fixture(scope="module")
def hsdp_resumed(fsdp_reference: Path) -> Path:
    """The reference's step-4 resumed under HSDP 2x2 on 4 ranks (checkpoints 8 and 12)."""
    run_dir = fsdp_reference.parent / "hsdp"
    err = launch(run_dir, "hsdp", 4, f"checkpoint.resume={fsdp_reference}/checkpoints/step-4")
    assert "resumed from" in err
    return run_dir


@pytest.mark.timeout(300)
def test_fsdp_checkpoint_of_2_ranks_resumes_under_hsdp_2x2_on_4(
    fsdp_reference: Path, hsdp_resumed: Path
) -> None:
    assert_continues(hsdp_resumed, fsdp_reference, first=5)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("source", "strategy", "ranks"),
    [("hsdp", "fsdp", 2), ("hsdp", "ddp", 2), ("reference", "fsdp", 4)],
    ids=["hsdp4-to-fsdp2", "hsdp4-to-ddp2", "fsdp2-to-fsdp4"],
)
def test_sharded_checkpoints_resume_on_another_mesh_and_world_size(
    fsdp_reference: Path, hsdp_resumed: Path, source: str, strategy: str, ranks: int
) -> None:
    # The global batch stays 8 samples (data.batch_size = 8 / ranks): the same samples per step,
    # so the losses compare; the per-rank split of a step differs between world sizes.
    run_dir = fsdp_reference.parent / f"{source}-to-{strategy}{ranks}"
    step = 8 if source == "hsdp" else 4
    origin = hsdp_resumed if source == "hsdp" else fsdp_reference
    launch(run_dir, strategy, ranks, f"checkpoint.resume={origin}/checkpoints/step-{step}")
    assert_continues(run_dir, fsdp_reference, first=step + 1)


@pytest.mark.timeout(120)
def test_export_of_an_hsdp_checkpoint_gives_the_whole_model(hsdp_resumed: Path) -> None:
    out = hsdp_resumed / "exported.pt"
    step_dir = hsdp_resumed / "checkpoints" / "step-12"
    result = run([str(VENV_BIN / "phalanx"), "export", str(step_dir), str(out)], timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    exported = torch.load(out, weights_only=True)
    final = torch.load(hsdp_resumed / "final.pt", weights_only=True)  # gathered after step 12
    assert exported.keys() == final.keys() and "blocks.0.0.weight" in final
    for name, tensor in final.items():
        assert torch.equal(exported[name], tensor), name
