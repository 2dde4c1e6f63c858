"""Real SLURM: srun tasks, `phalanx run` per node, refused nested launchers, batch, mpirun.

Every test is one sbatch job on the session's two-node cluster (tests/cluster/conftest.py); the
probe all-gathers each rank's detected environment, so a written probe.json also proves that
the process group formed from what phalanx detected.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from phalanx.env.node_addr import resolves
from tests.conftest import need_command
from tests.support.checks import assert_geometry, read_probe
from tests.support.procs import VENV_BIN
from tests.support.slurm_cluster import SECOND_NODE, SlurmCluster

PROBE = str(Path(__file__).parents[1] / "support" / "probe.py")
pytestmark = pytest.mark.cluster

# Both slurmd "nodes" live on this host and SLURM orders nodes by name, so a step's first node
# may be `node2`, a name no resolver knows (NodeAddr=127.0.0.1): the jobs below export no
# MASTER_ADDR, so phalanx finds rank 0's address through `scontrol show node` by itself.

# What job scripts had to do before phalanx asked `scontrol show node` itself; other cluster
# tests still export it (harmless: MASTER_ADDR always wins).
EXPORT_MASTER_ADDR = """\
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_ADDR=$(scontrol show node "$first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)"""

EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)):", re.MULTILINE)
"""The last line of a Python traceback: the exception's qualified name."""


@dataclass(frozen=True, repr=False)
class Job:
    """A finished batch job: id, final state and what it wrote to --output / --error."""

    job_id: str
    state: str
    exit_code: str
    """SLURM's EXIT:SIGNAL of the batch script, e.g. '2:0'."""
    stdout: str
    stderr: str

    def __repr__(self) -> str:
        """Assertion messages show the job's whole output, not a one-line dataclass repr."""
        return (
            f"job {self.job_id} ended {self.state} ({self.exit_code})\n--- job.out\n{self.stdout}"
            f"--- job.err\n{self.stderr}"
        )


def run_job(
    slurm: SlurmCluster, out: Path, body: str, *sbatch_args: str, timeout: float = 60.0
) -> Job:
    """Submit `body` as a batch script with the venv on PATH; wait for its final state."""
    script = "\n".join(
        (
            "#!/bin/bash",
            f"#SBATCH --output={out}/job.out",
            f"#SBATCH --error={out}/job.err",
            "#SBATCH --time=2",  # SLURM's own backstop, should the test's deadline not fire
            "set -euo pipefail",
            f'export PATH="{VENV_BIN}:$PATH"',
            "export OMP_NUM_THREADS=1",
            body,
            "",
        )
    )
    job_id = slurm.sbatch(script, *sbatch_args)
    try:
        state = slurm.wait(job_id, timeout)
    except BaseException:  # also pytest-timeout's: never leave a job running for the next test
        slurm.cancel(job_id)
        raise
    exit_code = slurm.job(job_id).get("ExitCode", "?")
    return Job(job_id, state, exit_code, _read(out / "job.out"), _read(out / "job.err"))


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def node_order(slurm: SlurmCluster, job_id: str) -> list[str]:
    """The job's nodes in SLURM's order (node 0 first), expanded by SLURM itself."""
    return slurm.hostnames(slurm.job(job_id)["NodeList"])


@pytest.mark.timeout(90)
def test_srun_two_tasks_on_one_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = run_job(slurm, tmp_path, f"srun python {PROBE} {tmp_path}", "--nodes=1", "--ntasks=2")
    assert job.state == "COMPLETED", job
    records = assert_geometry(read_probe(tmp_path), world_size=2, num_nodes=1, launcher="slurm")
    assert {r["job_id"] for r in records} == {job.job_id}


@pytest.mark.timeout(90)
def test_srun_two_nodes_two_tasks_each(slurm: SlurmCluster, tmp_path: Path) -> None:
    body = f"srun python {PROBE} {tmp_path}"
    job = run_job(slurm, tmp_path, body, "--nodes=2", "--ntasks-per-node=2")
    assert job.state == "COMPLETED", job
    records = assert_geometry(read_probe(tmp_path), world_size=4, num_nodes=2, launcher="slurm")
    nodes = node_order(slurm, job.job_id)
    assert {r["node"]: r["node_rank"] for r in records} == {n: i for i, n in enumerate(nodes)}


@pytest.mark.timeout(120)
def test_phalanx_run_once_per_node(slurm: SlurmCluster, tmp_path: Path) -> None:
    """`srun --ntasks-per-node=1 phalanx run -n 2`: phalanx fills in nnodes and the rendezvous."""
    body = f"srun --ntasks-per-node=1 phalanx run -n 2 {PROBE} {tmp_path}"
    job = run_job(slurm, tmp_path, body, "--nodes=2", "--ntasks-per-node=1", timeout=100)
    assert job.state == "COMPLETED", job
    records = assert_geometry(read_probe(tmp_path), world_size=4, num_nodes=2, launcher="torchrun")
    assert {r["job_id"] for r in records} == {job.job_id}
    # torchrun's c10d rendezvous numbers the nodes in joining order, not in SLURM's order.
    assert {r["node"] for r in records} == set(node_order(slurm, job.job_id))


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("killing", "launch"),
    [
        (False, "phalanx run -n 2"),
        (True, "phalanx run -n 2"),  # srun as `phalanx submit` scripts run it
        (False, "torchrun --standalone --nproc_per_node=2"),
    ],
    ids=["phalanx-run", "phalanx-run-kill-on-bad-exit", "plain-torchrun"],
)
def test_launcher_inside_multi_task_step_is_refused(
    slurm: SlurmCluster, tmp_path: Path, killing: bool, launch: str
) -> None:
    export = "export SLURM_KILL_BAD_EXIT=1\n" if killing else ""
    body = f"{export}srun --ntasks-per-node=2 {launch} {PROBE} {tmp_path}"
    job = run_job(slurm, tmp_path, body, "--nodes=1", "--ntasks-per-node=2")
    assert job.state == "FAILED", job
    output = job.stdout + job.stderr
    assert "double spawn" in output and "srun --ntasks-per-node=1" in output, job
    assert not (tmp_path / "probe.json").exists(), job
    if launch.startswith("phalanx"):
        # Each task stops before torchrun exists with code 2; task 0 prints the one line. When
        # srun kills on a bad exit, task 0 may be stopped first: then every task prints it.
        lines = [line for line in output.splitlines() if not line.startswith("srun: ")]
        assert len(lines) in ((1, 2) if killing else (1,)), job
        assert len(set(lines)) == 1 and lines[0].startswith("phalanx run: error: "), job
        assert "Traceback" not in output, job
        assert job.exit_code == "2:0" or killing, job
    else:
        # phalanx refuses inside each worker (detect()), before any rendezvous: one line for
        # the job, from the worker that is rank 0 of task 0 (if it was not stopped first).
        # Each torchrun agent still raises ChildFailedError with its own traceback and summary
        # (which shows that line as the cause) and exits 1, so srun's exit code is 1, not 2.
        # Each agent's summary shows its first failed worker's error file (the line); the
        # printed line can be missing when the agent stopped that worker before it printed.
        causes = re.findall(r"traceback : (error: .*)", output)
        assert len(causes) >= 2 and set(causes) == {causes[0]}, job
        assert "double spawn" in causes[0], job
        ours = [line for line in output.splitlines() if line.startswith("error: ")]
        assert ours in ([], [causes[0]]), job
        assert set(EXCEPTION_LINE.findall(output)) == {
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
        }, job
        assert job.exit_code == "1:0", job


@pytest.mark.timeout(90)
def test_srun_on_a_node_whose_name_does_not_resolve_meets_at_its_node_addr(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    node = SECOND_NODE
    assert not resolves(node), f"{node} must be absent from DNS and /etc/hosts for this test"
    body = f"srun python {PROBE} {tmp_path}"
    job = run_job(slurm, tmp_path, body, "--ntasks=2", f"--nodelist={node}")
    assert job.state == "COMPLETED", job
    records = assert_geometry(read_probe(tmp_path), world_size=2, num_nodes=1, launcher="slurm")
    assert {(r["node"], r["master_addr"]) for r in records} == {(node, "127.0.0.1")}, records


@pytest.mark.timeout(90)
def test_srun_without_an_address_for_rank_0_fails_in_seconds_with_one_line(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The tasks cannot run scontrol (as in a container without SLURM's client tools)."""
    body = "\n".join(
        (
            "start=$(date +%s%N)",
            f"srun env PATH=/nonexistent {VENV_BIN / 'python'} {PROBE} {tmp_path} || code=$?",
            'echo "elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))"',
            "exit ${code:-0}",
        )
    )
    job = run_job(slurm, tmp_path, body, "--ntasks=2", f"--nodelist={SECOND_NODE}")
    assert job.state == "FAILED" and job.exit_code == "2:0", job
    ours = [line for line in job.stderr.splitlines() if not line.startswith("srun: ")]
    assert len(ours) == 1, job
    assert ours[0].startswith(f"error: rank 0's node '{SECOND_NODE}' does not resolve"), job
    assert "scontrol is not on PATH" in ours[0], job
    assert ours[0].endswith(f"export MASTER_ADDR=<address of {SECOND_NODE}> before srun"), job
    elapsed_s = int(re.findall(r"elapsed_ms=(\d+)", job.stdout)[-1]) / 1000
    assert elapsed_s < 60, job


@pytest.mark.timeout(60)
def test_python_in_batch_script_is_one_local_process(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Without srun the batch script is ONE process, whatever SLURM_NTASKS says."""
    job = run_job(slurm, tmp_path, f"python {PROBE} {tmp_path}", "--nodes=1", "--ntasks=2")
    assert job.state == "COMPLETED", job
    (record,) = assert_geometry(read_probe(tmp_path), world_size=1, num_nodes=1, launcher="local")
    assert record["job_id"] == job.job_id


@pytest.mark.timeout(60)
def test_info_agrees_on_every_task(slurm: SlurmCluster, tmp_path: Path) -> None:
    body = "srun --nodes=2 --ntasks-per-node=2 phalanx info --json"
    job = run_job(slurm, tmp_path, body, "--nodes=2", "--ntasks-per-node=2")
    assert job.state == "COMPLETED", job
    infos = [json.loads(line) for line in job.stdout.splitlines() if line.startswith("{")]
    assert sorted(i["rank"] for i in infos) == [0, 1, 2, 3], job
    assert {i["launcher"] for i in infos} == {"slurm"}, job
    first = node_order(slurm, job.job_id)[0]
    assert {i["master_addr"] for i in infos} == {first if resolves(first) else "127.0.0.1"}, job
    ports = {i["master_port"] for i in infos}
    assert len(ports) == 1, job
    # Linux hands out 32768-60999 for outgoing connections; a store port there may be taken.
    assert not 32768 <= ports.pop() <= 60999, job


@pytest.mark.timeout(90)
@pytest.mark.parametrize("node_index", [0, 1], ids=["batch-environment", "orted-srun-step"])
def test_mpirun_inside_sbatch_is_detected_as_mpi(
    slurm: SlurmCluster, tmp_path: Path, node_index: int
) -> None:
    """Every mpirun rank inherits SLURM variables; MPI must still win the detection.

    On the node named like this host, OpenMPI starts the ranks itself: they see the batch
    environment. On `node2` it takes the node for a remote one and starts its daemon through a
    one-task srun step, so the ranks also carry that step's SLURM_STEP_* variables.
    """
    need_command("mpirun")
    node = slurm.node_names[node_index]
    mpirun = "mpirun --allow-run-as-root --oversubscribe"
    body = (
        f"{mpirun} -np 1 sh -c 'echo inherited_step=${{SLURM_STEP_ID:-none}}'\n"
        f"{mpirun} -np 2 python {PROBE} {tmp_path}"
    )
    job = run_job(slurm, tmp_path, body, "--nodes=1", "--ntasks=2", f"--nodelist={node}")
    assert job.state == "COMPLETED", job
    expected_step = "none" if node_index == 0 else "0"
    assert f"inherited_step={expected_step}" in job.stdout, job
    records = assert_geometry(read_probe(tmp_path), world_size=2, num_nodes=1, launcher="mpi")
    assert {r["job_id"] for r in records} == {job.job_id}
