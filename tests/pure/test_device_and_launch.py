"""Device and backend choice from the geometry; `phalanx run`'s plan and torchrun arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx import UsageError
from phalanx.dist.device import select_backend, select_device
from phalanx.env.slurm import derive_port
from phalanx.launch.local import RunSpec, plan_run, torchrun_argv
from tests.support.envtables import hydra, openmpi, single_node, srun, torchrun


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "gpus", "device"),
    [
        (2, 4, 4, "cuda:2"),
        (7, 8, 8, "cuda:7"),
        (1, 2, 2, "cuda:1"),
        (0, 1, 1, "cuda:0"),
        (3, 4, 1, "cuda:0"),
        (0, 1, 0, "cpu"),
        (3, 4, 0, "cpu"),
    ],
)
def test_select_device(local_rank: int, local_world_size: int, gpus: int, device: str) -> None:
    assert select_device(single_node(local_rank, local_world_size), gpus) == device


@pytest.mark.parametrize(("local_world_size", "gpus"), [(2, 4), (4, 2), (1, 8), (3, 2)])
def test_select_device_refuses_shared_or_skipped_gpus(local_world_size: int, gpus: int) -> None:
    with pytest.raises(UsageError) as caught:
        select_device(single_node(0, local_world_size), gpus)
    message = str(caught.value)
    for word in (
        f"{gpus} GPUs",
        f"{local_world_size} ranks",
        f"--ntasks-per-node={gpus}",
        f"phalanx run -n {gpus}",
        "--gpus-per-task=1",
        "CUDA_VISIBLE_DEVICES",
    ):
        assert word in message, message


@pytest.mark.parametrize(
    ("requested", "device", "backend"),
    [
        ("auto", "cuda:0", "nccl"),
        ("auto", "cuda:3", "nccl"),
        ("auto", "cpu", "gloo"),
        ("gloo", "cuda:1", "gloo"),
        ("gloo", "cpu", "gloo"),
        ("nccl", "cuda:0", "nccl"),
    ],
)
def test_select_backend(requested: str, device: str, backend: str) -> None:
    assert select_backend(requested, device) == backend


@pytest.mark.parametrize(
    ("requested", "device", "words"),
    [
        ("nccl", "cpu", ["'nccl' needs a CUDA GPU", "'gloo'"]),
        ("mpi", "cpu", ["'mpi'", "auto, nccl, gloo"]),
        ("NCCL", "cuda:0", ["'NCCL'"]),
    ],
)
def test_select_backend_refused(requested: str, device: str, words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        select_backend(requested, device)
    for word in words:
        assert word in str(caught.value)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"nproc_per_node": 0}, ["-n/--nproc-per-node must be >= 1", "got 0"]),
        ({"nproc_per_node": -2}, ["got -2"]),
        ({"nnodes": 0}, ["--nnodes must be >= 1"]),
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, ["--node-rank 2", "0..1"]),
        ({"node_rank": -1}, ["--node-rank -1"]),
        ({"max_restarts": -1}, ["--max-restarts must be >= 0"]),
        ({"nnodes": 2}, ["--nnodes 2 needs --rdzv-endpoint HOST:PORT"]),
        *[
            ({"nnodes": 2, "rdzv_endpoint": bad}, [f"{bad!r} is not HOST:PORT"])
            for bad in ("node01", "node01:", ":29400", "node01:abc", "node01:0", "node01:70000")
        ],
        ({"script": "missing.py"}, ["script 'missing.py' not found", "-m MODULE"]),
    ],
)
def test_run_spec_refused(script: str, fields: dict[str, object], words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        RunSpec(**{"nproc_per_node": 1, "script": script, **fields})  # type: ignore[arg-type]
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("endpoint", ["node01:29400", "[::1]:29400", "10.0.0.1:1", "h:65535"])
def test_run_spec_accepts_endpoints(script: str, endpoint: str) -> None:
    assert RunSpec(nproc_per_node=1, script=script, nnodes=2, rdzv_endpoint=endpoint)


def test_run_spec_module_need_not_be_a_file() -> None:
    assert RunSpec(nproc_per_node=1, script="pkg.train", module=True).module


def test_torchrun_argv_single_node(script: str) -> None:
    spec = RunSpec(nproc_per_node=2, script=script, script_args=("--lr", "0.1"))
    assert torchrun_argv(spec) == ["--nproc-per-node=2", "--standalone", script, "--lr", "0.1"]


@pytest.mark.parametrize(
    ("node_rank", "conf"),
    [(0, ["--rdzv-conf=is_host=1"]), (1, ["--rdzv-conf=is_host=0"]), (None, [])],
)
def test_torchrun_argv_several_nodes(script: str, node_rank: int | None, conf: list[str]) -> None:
    spec = RunSpec(
        nproc_per_node=4,
        script=script,
        nnodes=2,
        node_rank=node_rank,
        rdzv_endpoint="node01:29400",
        rdzv_id="job7",
    )
    assert torchrun_argv(spec) == [
        "--nproc-per-node=4",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node01:29400",
        "--rdzv-id=job7",
        *conf,
        script,
    ]


def test_torchrun_argv_module_and_restarts() -> None:
    spec = RunSpec(
        nproc_per_node=1, script="pkg.train", module=True, max_restarts=3, script_args=("--x",)
    )
    assert torchrun_argv(spec) == [
        "--nproc-per-node=1",
        "--standalone",
        "--max-restarts=3",
        "--module",
        "pkg.train",
        "--x",
    ]


def test_torchrun_argv_one_node_with_endpoint_uses_c10d(script: str) -> None:
    spec = RunSpec(nproc_per_node=1, script=script, rdzv_endpoint="h:1")
    assert "--standalone" not in torchrun_argv(spec)
    assert "--rdzv-endpoint=h:1" in torchrun_argv(spec)


def test_torchrun_accepts_the_argv(script: str) -> None:
    """The flags are torch.distributed.run's own (its parser, no process started)."""
    from torch.distributed.run import get_args_parser

    spec = RunSpec(
        nproc_per_node=4,
        script=script,
        script_args=("--lr", "1"),
        nnodes=2,
        node_rank=1,
        rdzv_endpoint="node01:29400",
        rdzv_id="j.0",
        max_restarts=2,
    )
    args = get_args_parser().parse_args(torchrun_argv(spec))
    assert (args.nproc_per_node, args.nnodes, args.rdzv_backend) == ("4", "2", "c10d")
    assert (args.rdzv_endpoint, args.rdzv_id, args.rdzv_conf) == (
        "node01:29400",
        "j.0",
        "is_host=0",
    )
    assert (args.max_restarts, args.standalone, args.module) == (2, False, False)
    assert (args.training_script, args.training_script_args) == (script, ["--lr", "1"])
    single = get_args_parser().parse_args(
        torchrun_argv(RunSpec(nproc_per_node=1, script="m", module=True))
    )
    assert single.standalone and single.module and single.training_script == "m"


def test_plan_run_fills_in_multi_node_flags_under_srun(script: str) -> None:
    # The first node must resolve here: plan_run runs the real NodeAddr lookup otherwise.
    environ = srun(
        1, 0, 1, nodelist="localhost,node02", tasks="1(x2)", job="555", step="2",
        SLURMD_NODENAME="node02",
    )  # fmt: skip
    plan = plan_run(RunSpec(nproc_per_node=4, script=script), environ)
    assert (plan.nnodes, plan.node_rank) == (2, 1)
    assert plan.rdzv_endpoint == f"localhost:{derive_port('555', '2')}"
    assert plan.rdzv_id == "555.2"
    assert "--rdzv-conf=is_host=0" in torchrun_argv(plan)
    first = {**environ, "MASTER_PORT": "23456", "SLURM_PROCID": "0", "SLURMD_NODENAME": "localhost"}
    plan = plan_run(RunSpec(nproc_per_node=4, script=script), first)
    assert (plan.node_rank, plan.rdzv_endpoint) == (0, "localhost:23456")


@pytest.mark.parametrize(
    ("environ", "slurm", "fields"),
    [
        (srun(0, 0, 0, nodelist="localhost", tasks="1"), True, {}),
        (srun(1, 0, 1, tasks="1(x2)"), False, {}),
        (
            srun(1, 0, 1, nodelist="localhost,node02", tasks="1(x2)"),
            True,
            {"nnodes": 3, "rdzv_endpoint": "mine:1"},
        ),
        ({}, True, {}),
        (torchrun(0, 0, 1, 1), True, {}),
        (openmpi(0, 2, 0, 1), True, {}),
    ],
    ids=[
        "one-node-step",
        "slurm-off",
        "user-flags-kept",
        "no-launcher",
        "torchrun-1-local",
        "mpirun-1-local",
    ],
)
def test_plan_run_keeps_the_spec(
    script: str, environ: dict[str, str], slurm: bool, fields: dict[str, object]
) -> None:
    spec = RunSpec(nproc_per_node=2, script=script, **fields)  # type: ignore[arg-type]
    assert plan_run(spec, environ, slurm=slurm) == spec


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        (
            srun(3, 1, 1),
            ["srun step with 2 tasks on this node", "double spawn", "--ntasks-per-node=1"],
        ),
        (torchrun(1, 1, 2, 2), ["inside torchrun with 2 processes", "double spawn"]),
        (openmpi(1, 4, 1, 4), ["inside mpirun with 4 processes", "double spawn"]),
        (hydra(1, 2, 1, 2), ["inside mpirun with 2 processes", "double spawn"]),
        (srun(3, 1, 1, SLURM_STEP_NUM_TASKS="3"), ["2 tasks on this node"]),
        (srun(0, 0, 0, tasks="1(x2)", SLURM_STEP_NUM_NODES="3"), ["SLURM_STEP_NUM_NODES=3"]),
    ],
    ids=[
        "srun-2-per-node",
        "torchrun",
        "openmpi",
        "hydra",
        "srun-checked-first",
        "inconsistent-slurm",
    ],
)
def test_plan_run_refused(script: str, environ: dict[str, str], words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        plan_run(RunSpec(nproc_per_node=2, script=script), environ)
    for word in words:
        assert word in str(caught.value)
