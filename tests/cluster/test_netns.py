"""Two nodes with their own network, host name and /etc/hosts: `phalanx run --nnodes 2` on each.

The nodes are network namespaces on a private bridge (tests.support.netns). Nothing but the
host names and the rendezvous endpoint tells the two torchrun agents about each other, so this
is the multi-node path of a real cluster: c10d rendezvous on node1, gloo across the bridge.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import need
from tests.support.checks import assert_geometry, read_probe
from tests.support.netns import Cluster, missing_requirements, two_nodes
from tests.support.procs import VENV_BIN, base_env, run
from tests.support.reap import kill_and_wait, pids_in_netns

PROBE = str(Path(__file__).parents[1] / "support" / "probe.py")
MIN_CROSS_BYTES = 4096
"""Rendezvous, store and gloo traffic between the nodes is tens of kB; ARP alone is far less."""

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    problem = missing_requirements()
    need(problem is None, problem or "")
    with two_nodes(tmp_path_factory.mktemp("netns")) as built:
        yield built


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster; afterwards no process may be left on a node (torchrun's workers run in
    sessions of their own, out of reach of procs.run's process-group kill)."""
    yield cluster
    stray = [pid for node in cluster.nodes for pid in pids_in_netns(node.netns_path)]
    kill_and_wait(stray)
    assert not stray, f"processes {stray} outlived the test on the namespace nodes; killed"


def _on_both_nodes(nodes: Cluster, argv: list[str], timeout: float) -> None:
    """Start `argv` on every node at once; all must exit 0 within `timeout`."""
    with ThreadPoolExecutor(len(nodes.nodes)) as pool:
        commands = {node.hostname: nodes.command(node, argv) for node in nodes.nodes}
        futures = {
            name: pool.submit(run, cmd, timeout=timeout, env=base_env())
            for name, cmd in commands.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    for name, result in results.items():
        assert result.returncode == 0, f"{name} exited {result.returncode}:\n{result.stderr}"


@pytest.mark.timeout(150)
def test_phalanx_run_on_two_namespace_nodes(nodes: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hostname = socket.gethostname()
    before = {node.hostname: nodes.traffic_bytes(node) for node in nodes.nodes}
    flags = ["--nnodes", "2", "-n", "2", "--rdzv-endpoint", "node1:29400", "--rdzv-id", "t"]
    argv = [str(VENV_BIN / "phalanx"), "run", *flags, PROBE, str(out)]
    _on_both_nodes(nodes, argv, timeout=100)

    records = assert_geometry(
        read_probe(out), world_size=4, num_nodes=2, launcher="torchrun", host_key="hostname"
    )
    assert {r["hostname"] for r in records} == {"node1", "node2"}
    # node2's workers met at node1's store: a name only the nodes' /etc/hosts resolves.
    assert {r["master_addr"] for r in records} == {"node1"}, records
    for node in nodes.nodes:
        now = nodes.traffic_bytes(node)
        crossed = [after - then for after, then in zip(now, before[node.hostname], strict=True)]
        assert min(crossed) > MIN_CROSS_BYTES, f"{node.hostname} sent/received only {crossed} bytes"
    assert socket.gethostname() == hostname, "a node's host name leaked out of its namespace"


HSDP_WORKER = str(Path(__file__).parents[1] / "support" / "hsdp_worker.py")


@pytest.mark.timeout(200)
def test_hsdp_shards_within_each_node_and_trains_like_ddp(nodes: Cluster, tmp_path: Path) -> None:
    # train.hsdp_shard_size=0: a shard group is one node's 2 ranks; replicas meet across nodes.
    flags = ["--nnodes", "2", "-n", "2", "--rdzv-endpoint", "node1:29400", "--rdzv-id", "h"]
    argv = [str(VENV_BIN / "phalanx"), "run", *flags, HSDP_WORKER, "nodes", str(tmp_path)]
    _on_both_nodes(nodes, argv, timeout=150)
    r = json.loads((tmp_path / "nodes.json").read_text())
    assert r["placed"] == [["node1", [0, 1]], ["node1", [0, 1]], ["node2", [2, 3]],
                           ["node2", [2, 3]]]  # fmt: skip
    ddp, hsdp = r["ddp"], r["hsdp"]
    assert hsdp["placements"] == ["R", "S(0)"] and len(ddp["losses"]) == 6
    for key in ("losses", "grad_norms", "params"):
        diff = max(abs(a - b) for a, b in zip(ddp[key], hsdp[key], strict=True))
        assert diff < (1e-4 if key == "grad_norms" else 1e-5), key
