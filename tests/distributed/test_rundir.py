"""Run directory with real processes: resolved once by the launcher, read alike by every rank."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, base_env, run

PROBE = str(Path(__file__).parents[1] / "support" / "config_probe.py")
pytestmark = pytest.mark.dist
SECRETS = {
    "WANDB_API_KEY": "sekrit-wandb-123",
    "HF_TOKEN": "hf_sekrit456",
    "DB_PASSWORD": "pw-sekrit789",
    "SLURM_FAKE_SECRET": "slurmsekrit000",
    "MLFLOW_TRACKING_URI": "https://alice:urlsekrit@mlflow.example/",
}


def _only_run_dir(root: Path) -> Path:
    dirs = [p for p in root.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


@pytest.mark.timeout(180)
def test_launcher_resolves_once_and_every_rank_reads_the_same_bytes(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lr: 0.5\n  steps: 9\n")
    root = tmp_path / "runs"
    result = run(
        [
            str(VENV_BIN / "phalanx"),
            "run",
            "-n",
            "2",
            PROBE,
            "--config",
            str(cfg),
            "train.lr=0.25",
            f"run.root={root}",
            "run.name=exp",
        ],
        timeout=150,
        env=base_env(SECRETS),
    )
    assert result.returncode == 0, result.stderr
    run_dir = _only_run_dir(root)
    assert run_dir.name.startswith("exp-")
    text = (run_dir / "config.yaml").read_text()
    records = json.loads((run_dir / "probe-0.json").read_text())
    sha = hashlib.sha256(text.encode()).hexdigest()
    assert [r["config_sha"] for r in records] == [sha, sha]  # each rank read the launcher's file
    assert all(r["dumped"] == text for r in records)  # ...and parsed exactly what it says
    assert "lr: 0.25" in text and "steps: 9" in text  # override > file > default
    assert f"dir: {run_dir}" in text
    assert all(r["phalanx_vars"] == [] for r in records)  # no config through environment
    assert (run_dir / "logs" / "rank-0.log").read_text()
    assert (run_dir / "logs" / "rank-1.log").exists()
    node = json.loads((run_dir / "diagnostics" / "node-0.json").read_text())
    assert node["cluster_env"]["world_size"] == 2 and node["versions"]["torch"]
    assert node["environ"]["WANDB_API_KEY"] == "<redacted>"
    assert "alice:<redacted>@" in node["environ"]["MLFLOW_TRACKING_URI"]
    assert json.loads((run_dir / "diagnostics" / "git.json").read_text())["code_dir"]
    for path in run_dir.rglob("*"):
        if path.is_file():
            content = path.read_text(errors="replace")
            for secret in SECRETS.values():
                assert secret.split("@")[0].split(":")[-1] not in content, (path, secret)


@pytest.mark.timeout(120)
def test_bad_config_stops_before_any_worker(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    result = run(
        [str(VENV_BIN / "phalanx"), "run", "-n", "2", PROBE, "train.lrr=1", f"run.root={root}"],
        timeout=100,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config_probe.py: error: config key 'train.lrr' is unknown; did you mean 'train.lr'?"
    ]
    assert not root.exists()


@pytest.mark.timeout(120)
def test_concurrent_runs_get_their_own_directories(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    cmd = [str(VENV_BIN / "python"), PROBE, f"run.root={root}", "run.name=same"]
    procs = [
        subprocess.Popen(cmd, env=base_env(), stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    try:
        errors = [p.communicate(timeout=90)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    dirs = sorted(p for p in root.iterdir() if p.is_dir())
    assert len(dirs) == 3
    for d in dirs:  # each run wrote into its own directory only
        records = json.loads((d / "probe-0.json").read_text())
        assert records[0]["run_dir"] == str(d)


@pytest.mark.timeout(120)
def test_continue_a_run_reuses_its_directory_and_dry_run_keeps_nothing(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    first = run([str(VENV_BIN / "python"), PROBE, f"run.root={root}"], timeout=90)
    assert first.returncode == 0, first.stderr
    run_dir = _only_run_dir(root)
    again = run(
        [str(VENV_BIN / "python"), PROBE, "--config", str(run_dir / "config.yaml")], timeout=90
    )
    assert again.returncode == 0, again.stderr
    assert _only_run_dir(root) == run_dir
    dry_root = tmp_path / "dry"
    dry = run(
        [str(VENV_BIN / "python"), PROBE, f"run.root={dry_root}", "run.dry_run=true"], timeout=90
    )
    assert dry.returncode == 0, dry.stderr
    assert not dry_root.exists()
