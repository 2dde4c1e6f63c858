"""SLURM host lists and task counts: phalanx's own parser, checked against the real `scontrol`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from phalanx import UsageError
from phalanx.env import expand_hostlist, expand_tasks_per_node
from tests.conftest import need_command
from tests.support.procs import base_env


def _pad(prefix: str, lo: int, hi: int, width: int = 0, suffix: str = "") -> list[str]:
    return [f"{prefix}{n:0{width}d}{suffix}" for n in range(lo, hi + 1)]


HOSTLISTS = [
    ("node[001-003,010]", ["node001", "node002", "node003", "node010"]),
    ("single", ["single"]),
    ("gpu7", ["gpu7"]),
    ("n01", ["n01"]),
    ("a,b", ["a", "b"]),
    ("a[1-2],b3", ["a1", "a2", "b3"]),
    ("n[1-3],m[5-6]", ["n1", "n2", "n3", "m5", "m6"]),
    ("n[1-3,5,7-8]", ["n1", "n2", "n3", "n5", "n7", "n8"]),
    ("n[7,1-3]", ["n7", "n1", "n2", "n3"]),
    ("n[3,3-4]", ["n3", "n3", "n4"]),
    ("n[1-2],n[1-2]", ["n1", "n2", "n1", "n2"]),
    ("n[05]", ["n05"]),
    ("n[0-3]", ["n0", "n1", "n2", "n3"]),
    ("n[00-03]", ["n00", "n01", "n02", "n03"]),
    ("n[000-3]", ["n000", "n001", "n002", "n003"]),
    ("n[01-2]", ["n01", "n02"]),
    ("n[1-02]", ["n1", "n2"]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("n[01-02,7-8]", ["n01", "n02", "n7", "n8"]),
    ("n2[1-2]", ["n21", "n22"]),
    ("[1-3]", ["1", "2", "3"]),
    ("n[1-1000]", _pad("n", 1, 1000)),
    ("node[00001-10000]", _pad("node", 1, 10000, width=5)),
    ("n[1-65536]", _pad("n", 1, 65536)),
    ("  n[1-2]  ", ["n1", "n2"]),
    ("n[1-2], m3", ["n1", "n2", "m3"]),
    (" n[1-2] , m3 ", ["n1", "n2", "m3"]),
    ("a b", ["a", "b"]),
    ("a\tb\nc", ["a", "b", "c"]),
    ("my-node.example[1-2]", ["my-node.example1", "my-node.example2"]),
    ("192.168.1.[1-3]", ["192.168.1.1", "192.168.1.2", "192.168.1.3"]),
    ("N_x-1[1-2]", ["N_x-11", "N_x-12"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("rack[1-2]n[01-02]", ["rack1n01", "rack1n02", "rack2n01", "rack2n02"]),
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    # Three groups: scontrol loops over the groups before the last one from the right.
    ("x[1-3]y[1-2]z[5]", ["x1y1z5", "x2y1z5", "x3y1z5", "x1y2z5", "x2y2z5", "x3y2z5"]),
    (
        "r[1-2]-c[1-2]-n[1-2]",
        [
            "r1-c1-n1",
            "r1-c1-n2",
            "r2-c1-n1",
            "r2-c1-n2",
            "r1-c2-n1",
            "r1-c2-n2",
            "r2-c2-n1",
            "r2-c2-n2",
        ],
    ),
]

# A suffix after the last bracket group is SLURM >= 23.02.5 (commit 0994b5f, "Extend hostlist to
# support suffix"); older scontrol rejects it as "Invalid hostlist".
SUFFIX_SINCE = (23, 2, 5)
SUFFIXED = [
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("a.b-c[01-02].d", ["a.b-c01.d", "a.b-c02.d"]),
    ("n[1-2]x[3-4]y", ["n1x3y", "n1x4y", "n2x3y", "n2x4y"]),
    ("gpu[1-2]-ib,cpu3", ["gpu1-ib", "gpu2-ib", "cpu3"]),
]

# (text, words the message must contain, whether scontrol rejects it too). phalanx is stricter
# than scontrol on purpose where scontrol guesses (empty entries, 'n[1-]' read as 'n[1]').
MALFORMED = [
    ("", ["empty", "node[01-04]"], True),
    ("   ", ["empty"], True),
    ("n[1-2", ["unmatched '['"], False),
    ("n[", ["unmatched '['"], False),
    ("n1-2]", ["unmatched ']'"], False),
    ("n[1-2]]", ["unmatched ']'"], True),
    ("]n[1]", ["unmatched ']'"], False),
    ("n[]", ["empty range", "[]"], True),
    ("a[1-2]b[]", ["empty range"], True),
    ("n[3-1]", ["'3-1'", "downwards"], True),
    ("n[1-]", ["'1-'", "'N' or 'N-M'"], False),
    ("n[a-b]", ["'a-b'", "'N' or 'N-M'"], True),
    ("n[-1]", ["'-1'"], False),
    ("n[1-2x3]", ["'1-2x3'"], True),
    ("n[[1-2]]", ["'N' or 'N-M'"], True),
    ("n[1, 2]", ["' 2'"], False),
    ("a,,b", ["empty entry"], False),
    ("n[1-2],", ["empty entry"], False),
    (",n1", ["empty entry"], False),
]

TASKS = [
    ("1", [1]),
    ("4", [4]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("4,2(x2),1", [4, 2, 2, 1]),
    ("1(x4)", [1, 1, 1, 1]),
    ("8(x1)", [8]),
    ("3,1(x2),2(x2)", [3, 1, 1, 2, 2]),
    ("16(x128)", [16] * 128),
    (" 2(x2), 1 ", [2, 2, 1]),
]

TASKS_MALFORMED = ["", "2(x)", "2(x0)", "(x2)", "2x3", "2(3)", "a", "2,,1", "-1", "2(x3", "1.5"]


def _version(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    assert match, f"no version in {text!r}"
    return tuple(int(part) for part in match.groups())


@pytest.fixture(scope="module")
def scontrol_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # `scontrol show hostnames` contacts no daemon, but it refuses to start without a slurm.conf
    # naming a cluster and a controller; this one is never used to reach anything.
    conf: Path = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=phalanx-test\nSlurmctldHost=localhost\n")
    return base_env({"SLURM_CONF": str(conf)})


def scontrol(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    need_command("scontrol")
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def scontrol_hostnames(text: str, env: dict[str, str]) -> list[str] | None:
    """scontrol's expansion, or None where it prints 'Invalid hostlist' or nothing."""
    result = scontrol("show", "hostnames", text, env=env)
    hosts = result.stdout.split()
    return hosts if result.returncode == 0 and hosts else None


@pytest.mark.parametrize(("text", "expected"), HOSTLISTS + SUFFIXED)
def test_expand_hostlist(text: str, expected: list[str]) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(("text", "expected"), HOSTLISTS)
def test_scontrol_agrees(text: str, expected: list[str], scontrol_env: dict[str, str]) -> None:
    assert scontrol_hostnames(text, scontrol_env) == expected


@pytest.mark.parametrize(("text", "expected"), SUFFIXED)
def test_scontrol_agrees_on_suffixes(
    text: str, expected: list[str], scontrol_env: dict[str, str]
) -> None:
    hosts = scontrol_hostnames(text, scontrol_env)
    if hosts is None:
        printed = scontrol("--version", env=scontrol_env).stdout.strip()
        assert _version(printed) < SUFFIX_SINCE, f"{printed} should expand suffixes in {text!r}"
        pytest.skip(f"{printed} predates host list suffixes (SLURM 23.02.5)")
    assert hosts == expected


@pytest.mark.parametrize(("text", "words", "rejected"), MALFORMED)
def test_malformed_hostlist(
    text: str, words: list[str], rejected: bool, scontrol_env: dict[str, str]
) -> None:
    with pytest.raises(UsageError) as caught:
        expand_hostlist(text)
    message = str(caught.value)
    assert "host list" in message and "\n" not in message
    for word in words:
        assert word in message, message
    if rejected:
        assert scontrol_hostnames(text, scontrol_env) is None


@pytest.mark.parametrize(("text", "expected"), TASKS)
def test_expand_tasks_per_node(text: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(text) == expected


@pytest.mark.parametrize("text", TASKS_MALFORMED)
def test_malformed_tasks_per_node(text: str) -> None:
    with pytest.raises(UsageError, match=r"tasks per node .*'N' or 'N\(xM\)'"):
        expand_tasks_per_node(text)
