"""torch's flight recorder on every rank, read when a hang is called.

torch keeps, per rank, a ring buffer of the last collectives it entered (sequence number, op,
sizes, state: scheduled / started / completed), for NCCL and, from torch 2.13, for gloo too.
phalanx turns it on before the process group exists (dist.flight_recorder entries, unless the
user set torch's variables: phalanx.dist.process_group), and on a hang every rank hands its
newest entries to rank 0 with its stack (phalanx.lifecycle.hang). Rank 0 writes each rank's
entries beside the hang report, and one line from them: the newest collective some ranks
entered and others did not, which names the ranks that never arrived, whatever their Python
stacks say (torch's own analyzer does the same over full dumps:
`python -m torch.distributed.flight_recorder.fr_trace`). Cost: a ring buffer of that many
records per process group and one record per collective (with its Python stack where torch
captures one); not yet measured here: benchmarks/step_overhead.py with dist.flight_recorder=0
as the other side would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

KEPT = 64
"""Newest entries each rank hands over (the report needs the last few)."""


def dump() -> list[dict[str, Any]]:
    """This rank's newest entries ([] where this torch records nothing for the backend)."""
    try:
        from torch._C import _distributed_c10d as c10d

        # torch 2.11 names the NCCL-only reader after NCCL; later ones record gloo too.
        reader = getattr(c10d, "_dump_fr_trace_json", None) or c10d._dump_nccl_trace_json  # type: ignore[attr-defined]
        entries = json.loads(reader(True, False)).get("entries", [])
    except Exception:  # no recorder in this build or backend: the stacks still tell
        return []
    return list(entries)[-KEPT:]


def _entered(entries: list[dict[str, Any]]) -> dict[str, tuple[int, str]]:
    """Per process group: (the newest collective sequence number entered, its op)."""
    out: dict[str, tuple[int, str]] = {}
    for entry in entries:
        if entry.get("is_p2p"):
            continue
        group = str((entry.get("process_group") or ["?"])[-1])
        seq = int(entry.get("collective_seq_id", 0))
        if seq >= out.get(group, (-1, ""))[0]:
            out[group] = (seq, str(entry.get("profiling_name", "?")))
    return out


def missing_ranks(by_rank: Mapping[int, list[dict[str, Any]]]) -> str:
    """One line: in the group where ranks disagree, who entered the newest collective and who
    did not ("" when every rank's newest collectives agree, or nothing was recorded)."""
    entered = {rank: _entered(entries) for rank, entries in by_rank.items() if entries}
    groups = sorted({g for e in entered.values() for g in e})
    for group in groups:
        newest = {rank: e[group] for rank, e in entered.items() if group in e}
        top = max(seq for seq, _ in newest.values())
        behind = sorted(r for r, (seq, _) in newest.items() if seq < top)
        if not behind or len(newest) < len(entered):
            continue
        ahead = sorted(r for r in newest if r not in behind)
        op = next(name for seq, name in newest.values() if seq == top)
        last = ", ".join(f"{r}: #{newest[r][0]} {newest[r][1]}" for r in behind)
        return (f"flight recorder: rank(s) {', '.join(map(str, ahead))} entered collective "
                f"#{top} ({op}) of process group {group}; rank(s) {', '.join(map(str, behind))} "
                f"did not (their newest: {last})")  # fmt: skip
    return ""
