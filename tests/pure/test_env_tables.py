"""Environment tables for every launcher, through `phalanx.env.detect(environ=...)`.

Each table is the set of variables the launcher really exports (names from torchrun, OpenMPI,
Hydra/Intel MPI and slurmstepd). `mpi_exchange=` is detect's pure seam for the mpi4py all-gather;
the real mpirun path is tested in tests/cluster.
"""

from __future__ import annotations

import dataclasses

import pytest

from phalanx import UsageError
from phalanx.env import FIELDS, ClusterEnv, detect
from phalanx.env.mpi import Exchange
from phalanx.env.slurm import derive_port
from tests.support.envtables import (
    Env,
    exchange,
    geometry,
    hydra,
    no_mpi4py,
    openmpi,
    same_name,
    srun,
    torchrun,
)

PORT = derive_port("4242", "0")
TABLES = {
    "torchrun-single-node": (
        torchrun(1, 1, 2, 2, GROUP_RANK="0", GROUP_WORLD_SIZE="1"),
        geometry(1, 1, 2, 2, 0, 1, "10.0.0.1", 29400, "torchrun", "rdzv-7"),
    ),
    "torchrun-multi-node": (
        torchrun(5, 1, 8, 4, GROUP_RANK="1", GROUP_WORLD_SIZE="2"),
        geometry(5, 1, 8, 4, 1, 2, "10.0.0.1", 29400, "torchrun", "rdzv-7"),
    ),
    "torchrun-heterogeneous-groups": (
        torchrun(6, 0, 7, 1, GROUP_RANK="3", GROUP_WORLD_SIZE="4"),
        geometry(6, 0, 7, 1, 3, 4, "10.0.0.1", 29400, "torchrun", "rdzv-7"),
    ),
    "torchrun-in-srun-keeps-slurm-job-id": (
        {**srun(1, 0, 1, tasks="1(x2)"), **torchrun(5, 1, 8, 4, GROUP_RANK="1")},
        geometry(5, 1, 8, 4, 1, 2, "10.0.0.1", 29400, "torchrun", "4242"),
    ),
    "manual-env-one-node": (
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "MASTER_ADDR": "h0"},
        geometry(3, 3, 4, 4, 0, 1, "h0", 29500, "torchrun", None),
    ),
    "manual-env-two-nodes": (
        {
            "RANK": "3",
            "WORLD_SIZE": "4",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "h0",
            "MASTER_PORT": "1234",
        },
        geometry(3, 1, 4, 2, 1, 2, "h0", 1234, "torchrun", None),
    ),
    "slurm-2x2": (
        srun(3, 1, 1, SLURMD_NODENAME="node02"),
        geometry(3, 1, 4, 2, 1, 2, "node01", PORT, "slurm", "4242"),
    ),
    "slurm-heterogeneous-last-node": (
        srun(6, 0, 3, nodelist="node[1-4]", tasks="2(x3),1", SLURMD_NODENAME="node4"),
        geometry(6, 0, 7, 1, 3, 4, "node1", PORT, "slurm", "4242"),
    ),
    "slurm-heterogeneous-first-node": (
        srun(1, 1, 0, nodelist="node[1-4]", tasks="2(x3),1"),
        geometry(1, 1, 7, 2, 0, 4, "node1", PORT, "slurm", "4242"),
    ),
    "slurm-odd-nodelist": (
        srun(3, 0, 3, nodelist="gpu[07,10-11],cpu3", tasks="1(x4)", SLURMD_NODENAME="cpu3"),
        geometry(3, 0, 4, 1, 3, 4, "gpu07", PORT, "slurm", "4242"),
    ),
    "slurm-nodename-beats-nodeid": (
        srun(2, 0, 0, SLURMD_NODENAME="node02"),
        geometry(2, 0, 4, 2, 1, 2, "node01", PORT, "slurm", "4242"),
    ),
    "slurm-nodename-unknown-uses-nodeid": (
        srun(2, 0, 1, SLURMD_NODENAME="node02.cluster.example"),
        geometry(2, 0, 4, 2, 1, 2, "node01", PORT, "slurm", "4242"),
    ),
    "slurm-master-overrides": (
        srun(0, 0, 0, nodelist="solo", tasks="1", MASTER_ADDR="10.9.9.9", MASTER_PORT="23456"),
        geometry(0, 0, 1, 1, 0, 1, "10.9.9.9", 23456, "slurm", "4242"),
    ),
    "slurm-batch-step-is-local": (
        {k: v for k, v in srun(0, 0, 0).items() if not k.startswith("SLURM_STEP")},
        geometry(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "local", "4242"),
    ),
    "local-bare": ({}, geometry(0, 0, 1, 1, 0, 1, "127.0.0.1", 0, "local", None)),
    "local-with-master": (
        {"MASTER_ADDR": "h1", "MASTER_PORT": "2000"},
        geometry(0, 0, 1, 1, 0, 1, "h1", 2000, "local", None),
    ),
}


@pytest.mark.parametrize(("environ", "expected"), TABLES.values(), ids=TABLES.keys())
def test_table(environ: dict[str, str], expected: dict[str, object]) -> None:
    assert detect(environ, mpi_exchange=no_mpi4py, node_addr=same_name).as_dict() == expected


MPI_TABLES = {
    "openmpi-mpi4py-block": (
        openmpi(2, 4, 0, 2),
        exchange(["a", "a", "b", "b"], 41000),
        geometry(2, 0, 4, 2, 1, 2, "a", 41000, "mpi", "3245932545"),
    ),
    "openmpi-mpi4py-round-robin": (
        openmpi(1, 4, 0, 2),
        exchange(["a", "b", "a", "b"], 41000),
        geometry(1, 0, 4, 2, 1, 2, "a", 41000, "mpi", "3245932545"),
    ),
    "openmpi-two-nodes-one-host-name": (  # two slurmd (or containers) on one machine
        openmpi(2, 4, 0, 2),
        exchange(["vm"] * 4, 41000, nodes=["vm/7.0", "vm/7.0", "vm/7.1", "vm/7.1"]),
        geometry(2, 0, 4, 2, 1, 2, "vm", 41000, "mpi", "3245932545"),
    ),
    "openmpi-mpi4py-master-env-wins": (
        openmpi(0, 2, 0, 1, MASTER_ADDR="10.1.1.1", MASTER_PORT="3000"),
        exchange(["a", "b"], 41000),
        geometry(0, 0, 2, 1, 0, 2, "10.1.1.1", 3000, "mpi", "3245932545"),
    ),
    "openmpi-master-addr": (
        openmpi(3, 4, 1, 2, MASTER_ADDR="a"),
        no_mpi4py,
        geometry(3, 1, 4, 2, 1, 2, "a", derive_port("3245932545", "0"), "mpi", "3245932545"),
    ),
    "openmpi-one-node-without-mpi4py": (  # every rank local: rank 0 is on this host
        openmpi(1, 2, 1, 2),
        no_mpi4py,
        geometry(
            1, 1, 2, 2, 0, 1, "127.0.0.1", derive_port("3245932545", "0"), "mpi", "3245932545"
        ),
    ),
    "hydra-one-node-without-mpi4py": (
        hydra(2, 3, 2, 3, PMI_JOBID="77"),
        no_mpi4py,
        geometry(2, 2, 3, 3, 0, 1, "127.0.0.1", derive_port("77", "0"), "mpi", "77"),
    ),
    "mpich-hydra-mpi4py": (
        hydra(5, 6, 2, 3, PMI_JOBID="77"),
        exchange(["x"] * 3 + ["y"] * 3, 42000),
        geometry(5, 2, 6, 3, 1, 2, "x", 42000, "mpi", "77"),
    ),
    "mpich-hydra-master-addr": (
        hydra(5, 6, 2, 3, MASTER_ADDR="x"),
        no_mpi4py,
        geometry(5, 2, 6, 3, 1, 2, "x", 29500, "mpi", None),
    ),
    "intel-mpi-mpi4py": (
        hydra(1, 2, 1, 2, I_MPI_ROOT="/opt/intel/mpi", I_MPI_HYDRA_TOPOLIB="hwloc"),
        exchange(["n1", "n1"], 43000),
        geometry(1, 1, 2, 2, 0, 1, "n1", 43000, "mpi", None),
    ),
    "openmpi-inside-sbatch-is-mpi": (
        {**srun(0, 0, 0), **openmpi(1, 2, 1, 2)},
        exchange(["c", "c"], 44000),
        geometry(1, 1, 2, 2, 0, 1, "c", 44000, "mpi", "4242"),
    ),
}


@pytest.mark.parametrize(
    ("environ", "mpi_exchange", "expected"), MPI_TABLES.values(), ids=MPI_TABLES.keys()
)
def test_mpi_table(
    environ: dict[str, str], mpi_exchange: Exchange, expected: dict[str, object]
) -> None:
    assert detect(environ, mpi_exchange=mpi_exchange).as_dict() == expected


def test_pmi_rank_alone_is_an_srun_task_not_mpi() -> None:
    # srun --mpi=pmi2 exports PMI_RANK/PMI_SIZE for plain tasks; MPI_LOCALRANKID is mpirun's.
    environ = {**srun(3, 1, 1), "PMI_RANK": "3", "PMI_SIZE": "4"}
    assert (
        detect(environ, mpi_exchange=exchange(["wrong"], 1), node_addr=same_name).launcher
        == "slurm"
    )


@pytest.mark.parametrize(
    ("environ", "mpi_exchange", "words"),
    [
        (
            openmpi(0, 2, 0, 1),
            no_mpi4py,
            [
                "2 ranks on several nodes (1 on this one)",
                "pip install mpi4py",
                "export MASTER_ADDR",
            ],
        ),
        (hydra(0, 4, 0, 2), no_mpi4py, ["several nodes", "pip install mpi4py", "MASTER_ADDR"]),
        (openmpi(0, 4, 0, 2), exchange(["a", "b"], 1), ["4 MPI ranks", "sees 2"]),
        (openmpi(0, 6, 0, 4, MASTER_ADDR="a"), no_mpi4py, ["6 MPI ranks", "nodes of 4"]),
        (openmpi(0, 2, 0, 1, OMPI_COMM_WORLD_RANK="x"), no_mpi4py, ["OMPI_COMM_WORLD_RANK='x'"]),
        (openmpi(2, 2, 0, 1, MASTER_ADDR="a"), no_mpi4py, ["rank=2 not in 0..1"]),
    ],
    ids=[
        "openmpi-two-nodes-nothing",
        "hydra-two-nodes-nothing",
        "mpi4py-other-mpi",
        "uneven-fill",
        "not-int",
        "rank-too-big",
    ],
)
def test_mpi_refused(environ: dict[str, str], mpi_exchange: Exchange, words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        detect(environ, mpi_exchange=mpi_exchange)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"SLURM_STEP_NUM_NODES": "3"}, ["SLURM_STEP_NUM_NODES=3", "lists 2 hosts"]),
        ({"SLURM_STEP_NUM_TASKS": "5"}, ["SLURM_STEP_NUM_TASKS=5", "4 tasks"]),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, ["2 hosts", "counts 3 nodes"]),
        ({"SLURM_STEP_NODELIST": "node[01-03]"}, ["3 hosts", "counts 2 nodes"]),
        ({"SLURM_PROCID": "4"}, ["rank=4 not in 0..3"]),
        ({"SLURM_LOCALID": "2"}, ["local_rank=2 not in 0..1"]),
        ({"SLURM_NODEID": "2"}, ["SLURM_NODEID=2", "node[01-02]"]),
        ({"SLURM_NODEID": "-1"}, ["SLURM_NODEID=-1"]),
        ({"SLURM_NODEID": "one"}, ["SLURM_NODEID='one' is not an integer"]),
        ({"SLURM_STEP_NODELIST": "node[01-02"}, ["unmatched '['"]),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x)"}, ["'2(x)'"]),
        ({"SLURM_STEP_NODELIST": ""}, ["missing SLURM_STEP_NODELIST"]),
        ({"MASTER_PORT": "abc"}, ["MASTER_PORT='abc'", "1..65535"]),
        ({"MASTER_PORT": "70000"}, ["MASTER_PORT='70000'"]),
        ({"MASTER_PORT": "0"}, ["MASTER_PORT='0'"]),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_inconsistent_slurm(overrides: Env, words: list[str]) -> None:
    environ = {**srun(3, 1, 1), **overrides}
    with pytest.raises(UsageError) as caught:
        detect(environ)
    message = str(caught.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("nodeid", ["2", "7"])
def test_node_id_outside_step_is_usage_error_under_torchrun(nodeid: str) -> None:
    # The double-spawn check reads the tasks of this node before anything else validates them.
    environ = {**srun(0, 0, 0, tasks="1(x2)", SLURM_NODEID=nodeid), **torchrun(0, 0, 2, 1)}
    with pytest.raises(UsageError, match=f"SLURM_NODEID={nodeid}"):
        detect(environ)


IDS = [*range(1, 300), *range(1, 10**7, 99991), 2**31 - 1, 2**32 - 2, 10**12]


def test_derived_port_is_outside_the_ephemeral_range_for_many_ids() -> None:
    ports = [derive_port(str(job), str(step)) for job in IDS for step in range(20)]
    ports += [derive_port(f"{job}+1", "extern") for job in IDS]
    assert all(1024 < port < 32768 for port in ports), min(ports)
    assert len(set(ports)) > 1000


def test_derived_port_differs_for_the_next_step_and_job() -> None:
    for job in IDS:
        port = derive_port(str(job), "0")
        assert port == derive_port(str(job), "0")
        assert port != derive_port(str(job), "1")
        assert port != derive_port(str(job + 1), "0")
        block = {derive_port(str(job + k), str(step)) for k in range(10) for step in range(16)}
        assert len(block) == 160, f"steps 0-15 of jobs {job}..{job + 9} share a port"


def test_every_task_of_a_step_derives_the_same_port() -> None:
    tasks = [srun(rank, rank % 2, rank // 2, job="99", step="3") for rank in range(4)]
    ports = {detect(environ, node_addr=same_name).master_port for environ in tasks}
    assert ports == {derive_port("99", "3")}
    for job, step in (("99", "4"), ("100", "3")):
        assert (
            detect(srun(0, 0, 0, job=job, step=step), node_addr=same_name).master_port not in ports
        )


PRIORITY = {
    "torchrun-beats-srun": (
        {**srun(1, 0, 1, tasks="1(x2)"), **torchrun(1, 1, 4, 2)},
        {},
        "torchrun",
    ),
    "torchrun-beats-mpi": ({**openmpi(0, 1, 0, 1), **torchrun(0, 0, 1, 1)}, {}, "torchrun"),
    "mpi-beats-srun": ({**srun(3, 1, 1), **openmpi(0, 2, 0, 2)}, {}, "mpi"),
    "slurm-false-is-local": (srun(3, 1, 1), {"slurm": False}, "local"),
    "forced-local-in-torchrun": (torchrun(1, 1, 2, 2), {"launcher": "local"}, "local"),
    "forced-slurm-in-torchrun": (
        {**srun(3, 1, 1), **torchrun(0, 0, 1, 1)},
        {"launcher": "slurm"},
        "slurm",
    ),
    "forced-mpi": ({**srun(3, 1, 1), **hydra(0, 2, 0, 2)}, {"launcher": "mpi"}, "mpi"),
    "auto": (srun(3, 1, 1), {"launcher": "auto"}, "slurm"),
}


@pytest.mark.parametrize(("environ", "kwargs", "launcher"), PRIORITY.values(), ids=PRIORITY.keys())
def test_priority(environ: Env, kwargs: dict[str, object], launcher: str) -> None:
    env = detect(environ, mpi_exchange=exchange(["h0", "h0"], 45000), node_addr=same_name, **kwargs)  # type: ignore[arg-type]
    assert env.launcher == launcher


@pytest.mark.parametrize(
    ("environ", "kwargs", "words"),
    [
        ({}, {"launcher": "torchrun"}, ["'torchrun'", "RANK, WORLD_SIZE, LOCAL_RANK"]),
        ({}, {"launcher": "mpi"}, ["'mpi'", "OMPI_COMM_WORLD_*"]),
        ({"SLURM_JOB_ID": "1"}, {"launcher": "slurm"}, ["'slurm'", "SLURM_STEP_ID"]),
        (srun(0, 0, 0), {"launcher": "slurm", "slurm": False}, ["conflicts"]),
        ({}, {"launcher": "pbs"}, ["'pbs'", "auto, torchrun, mpi, slurm, local"]),
        ({"TORCHELASTIC_RUN_ID": "x"}, {}, ["missing WORLD_SIZE"]),
        ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, {}, ["without MASTER_ADDR"]),
    ],
    ids=[
        "torchrun",
        "mpi",
        "slurm-batch",
        "slurm-off",
        "unknown",
        "elastic-id-only",
        "no-master-addr",
    ],
)
def test_refused(environ: Env, kwargs: dict[str, object], words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        detect(environ, mpi_exchange=no_mpi4py, **kwargs)  # type: ignore[arg-type]
    for word in words:
        assert word in str(caught.value)


def test_torchrun_in_srun_with_two_tasks_per_node_is_a_double_spawn() -> None:
    environ = {**srun(3, 1, 1), **torchrun(1, 1, 4, 2)}
    with pytest.raises(UsageError, match=r"2 tasks on this node.*double spawn"):
        detect(environ)
    assert detect(environ, slurm=False).launcher == "torchrun"


def test_torchrun_in_srun_counts_the_tasks_of_this_node() -> None:
    base = {**srun(6, 0, 3, nodelist="node[1-4]", tasks="2(x3),1"), **torchrun(0, 0, 1, 1)}
    assert detect({**base, "SLURMD_NODENAME": "node4"}).launcher == "torchrun"
    with pytest.raises(UsageError, match="double spawn"):
        detect({**base, "SLURMD_NODENAME": "node2"})


def test_cluster_env_is_frozen_and_validated() -> None:
    env = detect({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 1  # type: ignore[misc]
    assert tuple(env.as_dict()) == FIELDS
    assert env.is_main_process and env.is_local_main_process
    other = dataclasses.replace(env, rank=1, local_rank=1, world_size=2, local_world_size=2)
    assert not other.is_main_process and not other.is_local_main_process
    with pytest.raises(UsageError, match="unknown launcher 'pbs'"):
        dataclasses.replace(env, launcher="pbs")
    with pytest.raises(UsageError, match=r"num_nodes=3 not in 1\.\.world_size=2"):
        ClusterEnv(**{**other.as_dict(), "num_nodes": 3})  # type: ignore[arg-type]


def test_detect_reads_nothing_but_its_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "h")
    assert detect({}).launcher == "local"
    assert detect().rank == 1


def test_dist_launcher_choices_are_the_launcher_table() -> None:
    # config sits below env and cannot import its table: this keeps the Literal in step.
    from typing import get_args

    from phalanx.config.schema import Launcher
    from phalanx.env import LAUNCHERS

    assert get_args(Launcher) == ("auto", *LAUNCHERS)


def test_the_launcher_table_follows_the_priority_order() -> None:
    from phalanx.env.launchers import LAUNCHER_TABLE, LAUNCHERS

    assert tuple(entry.name for entry in LAUNCHER_TABLE) == LAUNCHERS
