"""Assertions shared by the real-launcher tests: the geometry, not just the exit code."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def read_probe(out_dir: Path) -> dict[str, Any]:
    path = out_dir / "probe.json"
    assert path.exists(), f"rank 0 wrote no {path}: the job did not get through its collectives"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def assert_geometry(
    probe: dict[str, Any], *, world_size: int, num_nodes: int, launcher: str, host_key: str = "node"
) -> list[dict[str, Any]]:
    """Ranks are a permutation of 0..N-1; per host, local ranks are 0..k-1 with one node_rank."""
    records = probe["records"]
    assert sorted(r["rank"] for r in records) == list(range(world_size)), records
    assert {r["world_size"] for r in records} == {world_size}
    assert {r["num_nodes"] for r in records} == {num_nodes}
    assert {r["launcher"] for r in records} == {launcher}, records
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_host[r[host_key]].append(r)
    assert len(by_host) == num_nodes, f"expected {num_nodes} hosts, got {sorted(by_host)}"
    node_ranks = set()
    for host, group in by_host.items():
        assert sorted(r["local_rank"] for r in group) == list(range(len(group))), (host, group)
        assert {r["local_world_size"] for r in group} == {len(group)}, (host, group)
        ranks_of_host = {r["node_rank"] for r in group}
        assert len(ranks_of_host) == 1, f"host {host} has several node ranks: {ranks_of_host}"
        node_ranks |= ranks_of_host
    assert node_ranks == set(range(num_nodes)), node_ranks
    assert len({r["pid"] for r in records}) == world_size
    assert probe["allreduce_sum"] == world_size * (world_size + 1) / 2
    return records  # type: ignore[no-any-return]
