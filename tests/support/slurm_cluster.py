"""A real SLURM cluster on this one machine: slurmctld plus three slurmd "nodes".

The first node is named after `hostname -s`, the others (`node2`, `node3`) share the real host
and only differ by their slurmd ports, so a step over several nodes runs groups of tasks on one
kernel, told apart by SLURMD_NODENAME. The default partition holds the first two nodes; the
third is in partition `spare` only (see the template). Everything lives in a fresh state
folder; daemons are stopped by the PIDs in their pid files, never by name.

Robust to leftovers and neighbours: a session killed before its teardown leaves daemons holding
the default ports and a state folder under RUNS_DIR. Folders whose owning process is gone are
reaped (jobs cancelled, daemons stopped through their pid files); busy ports make this cluster
take free ones instead (start-ups are serialised by a lock so two sessions cannot pick the same
ones); a random FirstJobId keeps job ids, and the ports phalanx derives from them, apart from
any other cluster running beside this one. The slurm.conf template is slurm_cluster.conf.in.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.procs import base_env, python_stacks, run
from tests.support.reap import is_alive

RUNS_DIR = Path(tempfile.gettempdir()) / "phalanx-slurm"
MUNGE_DIR = Path("/run/munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
DEFAULT_PORTS = (6817, 6818, 6819, 6820)
"""slurmctld, then the slurmd of each node."""
SECOND_NODE = "node2"
THIRD_NODE = "node3"
SPARE_PARTITION = "spare"
"""The partition of all three nodes."""
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
_DAEMONS = ("slurmctld", "slurmd", "munged")
CONF_TEMPLATE = Path(__file__).with_name("slurm_cluster.conf.in")


def render_conf(state: Path, *, host: str, ports: Sequence[int], first_job_id: int) -> str:
    """slurm.conf of the three-node cluster whose files live under `state`."""
    ctld_port, node1_port, node2_port, node3_port = ports
    return CONF_TEMPLATE.read_text().format(
        host=host,
        node2=SECOND_NODE,
        node3=THIRD_NODE,
        state=state,
        ctld_port=ctld_port,
        node1_port=node1_port,
        node2_port=node2_port,
        node3_port=node3_port,
        first_job_id=first_job_id,
    )


@contextmanager
def _startup_lock() -> Iterator[None]:
    """Serialise cluster start-ups of concurrent test sessions (released if the owner dies)."""
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    with (RUNS_DIR / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def pick_ports() -> tuple[int, ...]:
    """The default ports (SLURM's own) when all are free, else ports the kernel hands out."""
    if all(_port_free(port) for port in DEFAULT_PORTS):
        return DEFAULT_PORTS
    ports: set[int] = set()
    while len(ports) < len(DEFAULT_PORTS):
        ports.add(_free_port())
    return tuple(sorted(ports))


def _read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_daemon(pid: int) -> bool:
    """Guards against PID reuse: only ever signal a process that is one of our daemons."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return os.path.basename(argv0) in _DAEMONS


def stop_pid(pid: int, *, grace_s: float = 5.0) -> None:
    """SIGTERM, wait for exit (deadline), then SIGKILL: one daemon, by its PID."""
    if not _is_daemon(pid):
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not is_alive(pid):
            return


def _owner_alive(run_dir: Path) -> bool:
    owner = _read_pid(run_dir / "owner.pid")
    return owner is not None and is_alive(owner)


def _other_live_runs(state: Path) -> bool:
    return any(run != state and _owner_alive(run) for run in RUNS_DIR.glob("run-*"))


def reap_stale_runs(runs_dir: Path = RUNS_DIR) -> None:
    """Cancel the jobs and stop the daemons of earlier sessions whose owner died; delete them."""
    if not runs_dir.is_dir():
        return
    for run_dir in runs_dir.glob("run-*"):
        if _owner_alive(run_dir):
            continue  # another live test session: leave its cluster alone
        if not (run_dir / "owner.pid").exists() and time.time() - run_dir.stat().st_mtime < 60:
            continue  # being created right now by another session (owner.pid comes next)
        SlurmCluster(run_dir).stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def munge_works(env: dict[str, str]) -> bool:
    """True when a munged answers on the default socket (credential round trip)."""
    encode = subprocess.run(["munge", "-n"], capture_output=True, env=env, timeout=10)
    if encode.returncode != 0:
        return False
    decode = subprocess.run(
        ["unmunge"], input=encode.stdout, capture_output=True, env=env, timeout=10
    )
    return decode.returncode == 0


def ensure_munge_key(key: Path = MUNGE_KEY) -> None:
    if key.exists():
        return
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    shutil.chown(key, "munge", "munge")


def parse_job(text: str) -> dict[str, str]:
    """Fields of one-line `scontrol show job -o` output (values with spaces are cut; unused)."""
    return dict(re.findall(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)", text))


class SlurmCluster:
    """Three slurmd nodes and a slurmctld on this machine; `start()` returns once all are idle."""

    def __init__(self, state: Path) -> None:
        """A cluster whose files live in `state`; see create() for a fresh one."""
        self.state = state
        self.conf = self.state / "slurm.conf"
        self.node_names = (socket.gethostname().split(".")[0], SECOND_NODE, THIRD_NODE)
        assert self.node_names[0] not in self.node_names[1:], "host name clashes with a node's"
        self.env = base_env({"SLURM_CONF": str(self.conf)})
        """Environment for SLURM commands (and, through sbatch, for the jobs)."""
        self._munged_pid: int | None = None
        self._jobs = 0

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls) -> SlurmCluster:
        """A cluster in a fresh folder under RUNS_DIR, owned by this process (not started)."""
        reap_stale_runs()
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        state = Path(tempfile.mkdtemp(prefix="run-", dir=RUNS_DIR))
        (state / "owner.pid").write_text(str(os.getpid()))
        return cls(state)

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        """Start munged (unless one answers), slurmctld and every slurmd; wait until idle."""
        for sub in ("state", "log", *(f"spool/{name}" for name in self.node_names)):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            # Two sessions starting at once would both find the default ports free; the lock
            # makes the second one see the first one's daemons listening and pick other ports.
            with _startup_lock():
                self._start_munge(deadline)
                self.conf.write_text(
                    render_conf(
                        self.state,
                        host=self.node_names[0],
                        ports=pick_ports(),
                        first_job_id=random.randint(1_000, 5_000_000),
                    )
                )
                self._daemon(["slurmctld", "-i"])
                for name in self.node_names:
                    self._daemon(["slurmd", "-N", name])
                self._wait_idle(deadline)
            self._check_own_daemons()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_own_daemons(self) -> None:
        """Idle nodes could be another cluster's answering on our ports: ours must be running."""
        for pid_file in ("slurmctld.pid", *(f"slurmd-{n}.pid" for n in self.node_names)):
            pid = _read_pid(self.state / pid_file)
            if pid is None or not (is_alive(pid) and _is_daemon(pid)):
                raise RuntimeError(f"{pid_file}: daemon not running (port taken?)\n{self.logs()}")

    def _start_munge(self, deadline: float) -> None:
        if munge_works(self.env):
            return
        ensure_munge_key()
        MUNGE_DIR.mkdir(parents=True, exist_ok=True)
        shutil.chown(MUNGE_DIR, "munge", "munge")
        MUNGE_DIR.chmod(0o755)
        # --force: a socket left by a dead munged would otherwise stop it from starting.
        self._daemon(["runuser", "-u", "munge", "--", "munged", "--force"])
        self._munged_pid = _read_pid(MUNGE_DIR / "munged.pid")
        while not munge_works(self.env):
            if time.monotonic() > deadline:
                raise RuntimeError("munged started but answers no credential request")
            time.sleep(0.05)

    def _daemon(self, cmd: list[str]) -> None:
        """Run a self-daemonising command; output goes to a file, since a daemon keeps its fds."""
        log = self.state / "log" / "start.log"
        with log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            code = subprocess.run(
                cmd, stdout=out, stderr=out, env=self.env, cwd=self.state, timeout=30
            ).returncode
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {code}\n{self.logs()}")

    def _wait_idle(self, deadline: float) -> None:
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            result = self.command(["sinfo", "-h", "-N", "-o", "%N %T"], check=False)
            rows = (line.split() for line in result.stdout.splitlines())
            states = {row[0]: row[1] for row in rows if len(row) == 2}
            if all(states.get(name) == "idle" for name in self.node_names):
                return
            time.sleep(0.05)
        raise RuntimeError(f"nodes not idle before the deadline: {states}\n{self.logs()}")

    def stop(self) -> None:
        """Cancel leftover jobs, then stop exactly the daemons this cluster started."""
        ctld = _read_pid(self.state / "slurmctld.pid")
        if ctld is not None and is_alive(ctld) and _is_daemon(ctld):
            self._cancel_all()
        for name in self.node_names:
            pid = _read_pid(self.state / f"slurmd-{name}.pid")
            if pid is not None:
                stop_pid(pid)
        if ctld is not None:
            stop_pid(ctld)
        # Another live session may have found our munged answering and be using it: then it
        # stays (a harmless system daemon) rather than breaking that session's jobs.
        if self._munged_pid is not None and not _other_live_runs(self.state):
            stop_pid(self._munged_pid)
        self._munged_pid = None

    def _cancel_all(self, timeout: float = 15.0) -> None:
        """Job processes belong to slurmstepd, not to slurmd: end them through SLURM first."""
        if self.command(["scancel", "--full", "--user=root"], check=False).returncode != 0:
            return  # slurmctld is not answering; nothing of ours can be running
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.command(["squeue", "-h", "-o", "%i"], check=False)
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.1)

    # -- jobs ------------------------------------------------------------------------------

    def command(
        self, cmd: Sequence[str], *, timeout: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A SLURM client command against this cluster."""
        result = run(cmd, timeout=timeout, env=self.env, cwd=self.state)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, script_text: str, *args: str) -> str:
        """Submit a batch script (extra sbatch options in `args`); returns the job id."""
        self._jobs += 1
        script = self.state / "jobs" / f"job-{self._jobs}.sh"
        script.parent.mkdir(exist_ok=True)
        script.write_text(script_text)
        result = self.command(["sbatch", "--parsable", *args, str(script)])
        return result.stdout.strip().split(";")[0]

    def cancel(self, job_id: str) -> None:
        """Cancel a job and all its steps (a no-op once it has ended)."""
        self.command(["scancel", "--full", job_id], check=False)

    def job(self, job_id: str) -> dict[str, str]:
        """The job's `scontrol show job` fields (JobState, ExitCode, NodeList...)."""
        return parse_job(self.command(["scontrol", "show", "job", "-o", job_id]).stdout)

    def wait(self, job_id: str, timeout: float) -> str:
        """Poll until the job reaches a final state and return it; cancel it past the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state in TERMINAL_STATES:
                return state
            time.sleep(0.1)
        stacks = job_stacks(job_id)  # before the cancel: where a hung job is stuck
        self.cancel(job_id)
        raise AssertionError(
            f"job {job_id} not finished after {timeout}s: {self.job(job_id)}\n{self.logs()}\n"
            f"{stacks}"
        )

    def wait_state(self, job_id: str, wanted: str, timeout: float) -> None:
        """Poll until the job is in state `wanted`; fail (and cancel it) on a final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state == wanted:
                return
            if state in TERMINAL_STATES:
                break
            time.sleep(0.1)
        self.cancel(job_id)
        raise AssertionError(f"job {job_id} never reached {wanted}: {self.job(job_id)}")

    def hostnames(self, hostlist: str) -> list[str]:
        """SLURM's own expansion of a compressed host list."""
        return self.command(["scontrol", "show", "hostnames", hostlist]).stdout.split()

    def logs(self, tail: int = 20) -> str:
        """The last lines of each daemon log, for failure messages."""
        parts = []
        for log in sorted((self.state / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def job_stacks(job_id: str) -> str:
    """py-spy's stack dump of every Python process of a job (found by SLURM_JOB_ID in its
    environment), for the failure message of a job that hangs."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"SLURM_JOB_ID={job_id}\0".encode() in environ.read_bytes():
                pids.append(int(environ.parent.name))
        except OSError:  # the process ended, or is not ours to read
            continue
    return python_stacks(pids)
