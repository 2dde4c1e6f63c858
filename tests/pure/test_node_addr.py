"""Rank 0's address under srun: the node name, else SLURM's NodeAddr, else one line with the fix.

The lookups are injected (`can_resolve`, `show_node`), as detect() takes `node_addr`; the real
ones run against the test cluster in tests/cluster/test_slurm.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from phalanx import UsageError
from phalanx.env import detect
from phalanx.env.node_addr import node_address, resolves
from tests.support.envtables import srun

SHOW_NODE = "NodeName=gpu7 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.3.0.7 NodeHostName=gpu7 Port=0"


def known(*hosts: str) -> Callable[[str], bool]:
    return lambda host: host in hosts


def show(text: str) -> Callable[[str], str]:
    def show_node(name: str) -> str:
        assert name == "gpu7", name
        return text

    return show_node


def fails(reason: str) -> Callable[[str], str]:
    def show_node(name: str) -> str:
        raise LookupError(reason)

    return show_node


def test_a_name_that_resolves_is_kept_and_slurm_is_not_asked() -> None:
    address = node_address("gpu7", can_resolve=known("gpu7"), show_node=fails("not called"))
    assert address == "gpu7"


def test_an_unresolvable_name_is_replaced_by_its_node_addr() -> None:
    address = node_address("gpu7", can_resolve=known("10.3.0.7"), show_node=show(SHOW_NODE))
    assert address == "10.3.0.7"


@pytest.mark.parametrize(
    ("show_node", "reason"),
    [
        (show(SHOW_NODE), "its NodeAddr '10.3.0.7' does not resolve either"),
        (show(SHOW_NODE.replace("10.3.0.7", "gpu7")), "its NodeAddr 'gpu7' does not resolve"),
        (show("Node gpu7 not found"), "no NodeAddr"),
        (fails("scontrol is not on PATH"), "scontrol is not on PATH"),
    ],
    ids=["addr-unresolvable", "addr-is-the-name", "no-addr", "scontrol-fails"],
)
def test_no_usable_address_is_one_line_naming_the_host_and_the_fix(
    show_node: Callable[[str], str], reason: str
) -> None:
    with pytest.raises(UsageError) as caught:
        node_address("gpu7", can_resolve=known(), show_node=show_node)
    message = str(caught.value)
    assert "\n" not in message
    assert "rank 0's node 'gpu7' does not resolve" in message
    assert reason in message
    assert message.endswith("export MASTER_ADDR=<address of gpu7> before srun")


def test_detect_asks_for_the_first_node_of_the_step_only_without_master_addr() -> None:
    asked: list[str] = []

    def node_addr(name: str) -> str:
        asked.append(name)
        return "10.0.0.5"

    environ = srun(3, 1, 1, nodelist="gpu[7-8]", SLURMD_NODENAME="gpu8")
    assert detect(environ, node_addr=node_addr).master_addr == "10.0.0.5"
    assert asked == ["gpu7"]
    assert detect({**environ, "MASTER_ADDR": "h0"}, node_addr=node_addr).master_addr == "h0"
    assert asked == ["gpu7"]


def test_inconsistent_geometry_fails_before_any_lookup() -> None:
    def node_addr(name: str) -> str:
        raise AssertionError("looked up a node of an inconsistent step")

    with pytest.raises(UsageError, match=r"rank=4 not in 0\.\.3"):
        detect(srun(4, 0, 1), node_addr=node_addr)


def test_resolves_knows_literal_addresses_and_refuses_garbage() -> None:
    assert resolves("127.0.0.1") and resolves("localhost")
    assert not resolves("no-such-node.invalid")
