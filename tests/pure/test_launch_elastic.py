"""Elastic membership in `phalanx run`: --nnodes MIN:MAX and --rdzv-conf rendered for torchrun,
and the environment torchrun gets across nodes (no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from phalanx import UsageError
from phalanx.launch.local import RunSpec, parse_nnodes, torchrun_argv, torchrun_environ

SHARE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("")
    return str(path)


def _elastic(script: str, **fields: Any) -> RunSpec:
    base: dict[str, Any] = dict(
        nproc_per_node=2, script=script, nnodes=2, min_nodes=1, node_rank=0,
        rdzv_endpoint="node1:29400", rdzv_id="j", max_restarts=2,
    )  # fmt: skip
    return RunSpec(**{**base, **fields})


@pytest.mark.parametrize(
    ("text", "parsed"), [("1", (None, 1)), ("4", (None, 4)), ("1:2", (1, 2)), ("2:2", (2, 2))]
)
def test_parse_nnodes(text: str, parsed: tuple[int | None, int]) -> None:
    assert parse_nnodes(text) == parsed


@pytest.mark.parametrize("text", ["", "a", "1:", ":2", "1:2:3", "-1", "1-2"])
def test_parse_nnodes_refuses_other_forms(text: str) -> None:
    with pytest.raises(UsageError, match="is not a number N or a range MIN:MAX"):
        parse_nnodes(text)


def test_elastic_argv_is_torchruns_own(script: str) -> None:
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    spec = _elastic(script, rdzv_conf=("last_call_timeout=2", "keep_alive_interval=1"))
    argv = torchrun_argv(spec)
    assert argv == [
        "--nproc-per-node=2", "--nnodes=1:2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=node1:29400", "--rdzv-id=j",
        "--rdzv-conf=is_host=1,last_call_timeout=2,keep_alive_interval=1", "--max-restarts=2",
        script,
    ]  # fmt: skip
    args = get_args_parser().parse_args(argv)
    assert parse_min_max_nnodes(args.nnodes) == (1, 2)
    assert args.rdzv_conf == "is_host=1,last_call_timeout=2,keep_alive_interval=1"
    without_rank = torchrun_argv(_elastic(script, node_rank=None, rdzv_conf=("join_timeout=9",)))
    assert "--rdzv-conf=join_timeout=9" in without_rank


ONE_NODE = {"nnodes": 1, "min_nodes": None, "node_rank": None, "rdzv_endpoint": None}
BAD = {
    "min-above-max": ({"min_nodes": 3}, "--nnodes 3:2: MIN must be between 1 and MAX"),
    "min-zero": ({"min_nodes": 0}, "--nnodes 0:2: MIN must be between 1 and MAX"),
    "no-restarts": ({"max_restarts": 0}, "add --max-restarts K (K >= 1)"),
    "unknown-key": ({"rdzv_conf": ("timeout=3",)}, "unknown key 'timeout'; valid: join_timeout"),
    "is-host": ({"rdzv_conf": ("is_host=1",)}, "unknown key 'is_host'"),
    "not-a-number": ({"rdzv_conf": ("last_call_timeout=0.5",)}, "a whole number >= 1"),
    "zero": ({"rdzv_conf": ("join_timeout=0",)}, "a whole number >= 1"),
    "one-node": (
        {**ONE_NODE, "rdzv_conf": ("join_timeout=5",)},
        "--rdzv-conf applies to the c10d rendezvous of --nnodes > 1 (or --rdzv-endpoint)",
    ),
}


@pytest.mark.parametrize(("fields", "message"), BAD.values(), ids=BAD.keys())
def test_bad_elastic_specs_are_one_line_usage_errors(
    script: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        _elastic(script, **fields)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_fixed_size_needs_no_restarts(script: str) -> None:
    assert "--nnodes=2:2" in torchrun_argv(_elastic(script, min_nodes=2, max_restarts=0))


def test_several_nodes_get_a_fresh_worker_store_per_round(script: str) -> None:
    environ = {"PATH": "/bin", SHARE_OFF: "0"}
    assert torchrun_environ(_elastic(script), environ) == {"PATH": "/bin", SHARE_OFF: "1"}
    assert environ[SHARE_OFF] == "0"  # the caller's mapping is not changed
    fixed = RunSpec(nproc_per_node=1, script=script, nnodes=2, rdzv_endpoint="h:1")
    assert torchrun_environ(fixed, {})[SHARE_OFF] == "1"
    one_node = RunSpec(nproc_per_node=2, script=script)
    assert torchrun_environ(one_node, {"PATH": "/bin"}) == {"PATH": "/bin"}
