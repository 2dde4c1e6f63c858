"""`phalanx doctor`'s node checks: each verdict from controlled inputs, and the command's
output and exit codes (the all-reduce part runs in tests/distributed/test_doctor.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from phalanx.doctor.checks import (
    check_disk,
    check_hostname,
    check_launcher,
    check_network,
    check_open_files,
    check_shm,
    check_slurm_tools,
)
from tests.support.procs import VENV_BIN, base_env, run

NAMES = ["versions", "gpus", "launcher", "shared memory", "open files", "hostname", "slurm",
         "disk", "network", "trackers"]  # fmt: skip


def test_open_file_limit_below_4096_warns_with_the_ulimit_fix() -> None:
    low = check_open_files((256, 1024))
    assert low.status == "warn" and "ulimit -n 1024" in low.detail
    assert check_open_files((65536, 65536)).status == "ok"


def test_missing_shared_memory_warns(tmp_path: Path) -> None:
    assert check_shm(str(tmp_path / "none")).status == "warn"
    here = check_shm(str(tmp_path))
    assert here.status in ("ok", "warn") and "GiB" in here.detail


def test_unresolvable_host_name_warns_with_the_master_addr_fix() -> None:
    def fail(host: str) -> str:
        raise socket.gaierror(-2, "Name or service not known")

    check = check_hostname(fail)
    assert check.status == "warn" and "export MASTER_ADDR=" in check.detail
    assert check_hostname(lambda host: "10.1.2.3").detail.endswith("-> 10.1.2.3")


def test_inside_a_slurm_job_without_scontrol_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol there
    check = check_slurm_tools({"SLURM_JOB_ID": "77"})
    assert check.status == "fail" and "no scontrol on PATH" in check.detail
    assert check_slurm_tools({}).detail == "not inside a SLURM job"


def test_broken_launcher_geometry_fails_with_the_detection_message() -> None:
    check = check_launcher({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert check.status == "fail" and "MASTER_ADDR" in check.detail


def test_network_lists_infiniband_and_nccl_variables_but_no_secret(tmp_path: Path) -> None:
    (tmp_path / "infiniband" / "mlx5_0").mkdir(parents=True)
    environ = {"NCCL_IB_HCA": "mlx5", "NCCL_TOKEN": "s3cret", "HOME": "/root"}
    check = check_network(environ, sysfs=tmp_path)
    assert check.detail == "InfiniBand: mlx5_0; NCCL_IB_HCA=mlx5"
    assert "s3cret" not in check.detail


def test_disk_check_names_the_existing_folder_it_measured(tmp_path: Path) -> None:
    check = check_disk(tmp_path / "runs" / "deeper")
    assert check.status in ("ok", "warn") and str(tmp_path) in check.detail


def test_doctor_json_prints_every_check_and_exits_by_the_worst() -> None:
    result = run([str(VENV_BIN / "phalanx"), "doctor", "--json"], timeout=120, env=base_env())
    checks = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["name"] for c in checks] == NAMES
    assert {c["status"] for c in checks} <= {"ok", "warn", "fail"}
    failed = any(c["status"] == "fail" for c in checks)
    assert result.returncode == (1 if failed else 0), result.stderr


def test_bad_doctor_arguments_are_one_line_and_exit_2() -> None:
    result = run([str(VENV_BIN / "phalanx"), "doctor", "--iters", "0"], timeout=60,
                 env=base_env())  # fmt: skip
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "phalanx doctor: error: -n must be >= 0, --iters >= 1 and every --sizes-mb > 0"
    ]
