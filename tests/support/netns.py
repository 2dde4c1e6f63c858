"""Two simulated nodes on this machine: network namespaces on a private bridge.

Each node has its own network stack and address, and every command run "on" it also gets its
own UTS hostname (node1 / node2) and an /etc/hosts that resolves both names, through
`nsenter --net` + `unshare --uts --mount`. The file system stays shared, like a cluster's
shared home.

Only the names below are ever touched: a 10.251.0.0/24 test subnet, bridge phxbr0, namespaces
phxA / phxB and their veths. `two_nodes()` removes all of it afterwards, also after a failure,
and first removes what an earlier aborted run may have left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.reap import kill_and_wait, pids_in_netns

BRIDGE = "phxbr0"
BRIDGE_ADDR = "10.251.0.254/24"
COMMANDS = ("ip", "nsenter", "unshare")
# `ip netns exec` is avoided on purpose: it remounts /sys in the namespace.
_IN_NODE = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'


@dataclass(frozen=True, kw_only=True)
class Node:
    """One simulated node."""

    hostname: str
    """Its host name, inside its own UTS namespace."""
    netns: str
    """Name of its network namespace (/run/netns/NAME)."""
    addr: str
    """Its IPv4 address on the test bridge."""
    veth: str
    """Host end of its veth pair, a port of the bridge; `veth + "n"` is the end inside."""

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns


NODES = (
    Node(hostname="node1", netns="phxA", addr="10.251.0.1", veth="phxvA"),
    Node(hostname="node2", netns="phxB", addr="10.251.0.2", veth="phxvB"),
)


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The nodes that two_nodes() built, and how to run a command on one of them."""

    nodes: tuple[Node, ...]
    hosts_file: Path
    """The /etc/hosts every node sees: localhost plus each node's name and address."""

    def command(self, node: Node, argv: Sequence[str]) -> list[str]:
        """`argv` run on `node`: its network, its host name, its /etc/hosts."""
        enter = ["nsenter", f"--net={node.netns_path}"]
        unshare = ["unshare", "--uts", "--mount", "--propagation", "private"]
        return [*enter, *unshare, "sh", "-c", _IN_NODE, node.hostname, str(self.hosts_file), *argv]

    def traffic_bytes(self, node: Node) -> tuple[int, int]:
        """(bytes sent, bytes received) by `node` through its link to the bridge so far."""
        # Counted on the host end of the pair, so node -> bridge is that end's rx.
        stats = Path("/sys/class/net") / node.veth / "statistics"
        return int((stats / "rx_bytes").read_text()), int((stats / "tx_bytes").read_text())


def missing_requirements() -> str | None:
    """What prevents building the nodes here (for tests.conftest.need), or None."""
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing:
        return f"command(s) {', '.join(missing)} (apt-get install iproute2 util-linux)"
    if os.geteuid() != 0:
        return "root (network namespaces, bridges and bind mounts need it)"
    return None


def _ip(*args: str, check: bool = True) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def remove_all() -> None:
    """Remove this module's namespaces, veths and bridge, and kill what still runs inside."""
    for node in NODES:
        # A namespace lives on while processes use it (and they hold ports on its address).
        kill_and_wait(pids_in_netns(node.netns_path))
        if node.netns_path.exists():
            _ip("netns", "delete", node.netns, check=False)
        # Deleting either end of a veth pair deletes both.
        if _link_exists(node.veth):
            _ip("link", "delete", node.veth, check=False)
    if _link_exists(BRIDGE):
        _ip("link", "delete", BRIDGE, check=False)
    # Each step above runs even if an earlier one failed; what is left is reported here.
    left = [str(n.netns_path) for n in NODES if n.netns_path.exists()]
    left += [name for name in (BRIDGE, *(n.veth for n in NODES)) if _link_exists(name)]
    if left:
        raise RuntimeError(f"could not remove test network devices/namespaces: {left}")


def _build(state_dir: Path) -> Cluster:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", BRIDGE_ADDR, "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for node in NODES:
        inner = node.veth + "n"
        _ip("netns", "add", node.netns)
        # Create the inner end directly in the namespace: no name clash on the host side.
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", inner, "netns", node.netns)
        _ip("link", "set", node.veth, "master", BRIDGE)
        _ip("link", "set", node.veth, "up")
        _ip("-n", node.netns, "addr", "add", f"{node.addr}/24", "dev", inner)
        _ip("-n", node.netns, "link", "set", inner, "up")
        _ip("-n", node.netns, "link", "set", "lo", "up")
    hosts = state_dir / "hosts"
    lines = ["127.0.0.1 localhost", *(f"{node.addr} {node.hostname}" for node in NODES)]
    hosts.write_text("\n".join(lines) + "\n")
    return Cluster(nodes=NODES, hosts_file=hosts)


@contextmanager
def two_nodes(state_dir: Path) -> Iterator[Cluster]:
    """Build node1 and node2 (after clearing leftovers); always tear them down on exit."""
    remove_all()
    try:
        yield _build(state_dir)
    finally:
        remove_all()
