"""SLURM `srun` tasks: geometry from the step's variables, never from the job's.

The batch script itself (step "batch") has no SLURM_STEP_* variables, and its SLURM_NTASKS is the
whole allocation: a batch script that runs python without srun is ONE process, so it is detected
as local, not as rank 0 of a job whose other ranks will never come.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import replace

from phalanx.env.cluster_env import ClusterEnv, read_int, read_port
from phalanx.env.hostlist import expand_hostlist, expand_tasks_per_node
from phalanx.env.node_addr import NodeAddr, node_address
from phalanx.errors import UsageError

PORT_BASE, PORT_SPAN = 15000, 15000
"""Derived ports lie in 15000..29999: below Linux's ephemeral range 32768-60999, where a port
may already be taken by some outgoing connection."""


def is_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside a task started by srun (the batch step has no SLURM_STEP_ID)."""
    return "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ


def derive_port(job_id: str, step_id: str) -> int:
    """A port every task of one step computes alike, different for the next step or job."""
    if job_id.isdigit() and step_id.isdigit():
        # Linear in both ids so that consecutive jobs and steps on one node do not collide.
        key = int(job_id) * 16 + int(step_id)
    else:
        key = zlib.crc32(f"{job_id}.{step_id}".encode())
    return PORT_BASE + key % PORT_SPAN


def step_tasks_on_this_node(environ: Mapping[str, str]) -> int:
    """How many tasks of the current srun step run on this node (1 outside a step)."""
    if not is_slurm_step(environ):
        return 1
    hosts, tasks = _step_layout(environ)
    return tasks[_node_rank(environ, hosts)]


def _step_layout(environ: Mapping[str, str]) -> tuple[list[str], list[int]]:
    for name in ("SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE"):
        if not environ.get(name):
            raise UsageError(f"SLURM step environment is missing {name}; start the task with srun")
    hosts = expand_hostlist(environ["SLURM_STEP_NODELIST"])
    tasks = expand_tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
    if len(hosts) != len(tasks):
        raise UsageError(
            f"inconsistent SLURM variables: SLURM_STEP_NODELIST has {len(hosts)} hosts but "
            f"SLURM_STEP_TASKS_PER_NODE={environ['SLURM_STEP_TASKS_PER_NODE']!r} counts "
            f"{len(tasks)} nodes; do not overwrite SLURM_* variables by hand"
        )
    return hosts, tasks


def _node_rank(environ: Mapping[str, str], hosts: list[str]) -> int:
    """Position of this node in the step (SLURMD_NODENAME is exact even for a partial step)."""
    name = environ.get("SLURMD_NODENAME")
    if name in hosts:
        return hosts.index(name)
    node_rank = read_int(environ, "SLURM_NODEID", launcher="slurm")
    if not 0 <= node_rank < len(hosts):
        raise UsageError(
            f"inconsistent SLURM variables: SLURM_NODEID={node_rank} but SLURM_STEP_NODELIST="
            f"{environ['SLURM_STEP_NODELIST']!r} has {len(hosts)} hosts; do not overwrite "
            "SLURM_* variables by hand"
        )
    return node_rank


def from_slurm(environ: Mapping[str, str], node_addr: NodeAddr = node_address) -> ClusterEnv:
    """Geometry of this srun task; counts come from SLURM_STEP_*, never the job-level ones.

    Rank 0's host is MASTER_ADDR when set, else the step's first node through `node_addr`
    (its name, or SLURM's NodeAddr where the name does not resolve).
    """

    def read(name: str) -> int:
        return read_int(environ, name, launcher="slurm")

    hosts, tasks = _step_layout(environ)
    world_size, num_nodes = read("SLURM_STEP_NUM_TASKS"), read("SLURM_STEP_NUM_NODES")
    if num_nodes != len(hosts) or world_size != sum(tasks):
        raise UsageError(
            f"inconsistent SLURM variables: SLURM_STEP_NUM_NODES={num_nodes} and "
            f"SLURM_STEP_NUM_TASKS={world_size}, but the step lists {len(hosts)} hosts and "
            f"{sum(tasks)} tasks; do not overwrite SLURM_* variables by hand"
        )
    node_rank = _node_rank(environ, hosts)
    job_id = environ.get("SLURM_JOB_ID", "0")
    step_id = environ["SLURM_STEP_ID"]
    env = ClusterEnv(
        rank=read("SLURM_PROCID"),
        local_rank=read("SLURM_LOCALID"),
        world_size=world_size,
        local_world_size=tasks[node_rank] if node_rank < len(tasks) else 0,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=environ.get("MASTER_ADDR") or hosts[0],
        master_port=read_port(environ, default=derive_port(job_id, step_id)),
        launcher="slurm",
        job_id=environ.get("SLURM_JOB_ID"),
    )
    # Looked up once the geometry is valid: a lookup may ask slurmctld, an inconsistent
    # environment should fail without it.
    return env if environ.get("MASTER_ADDR") else replace(env, master_addr=node_addr(hosts[0]))
