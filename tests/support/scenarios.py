"""The command line every scenario worker shares:

    phalanx run -n N some_worker.py ITEM[,ITEM...] OUT [key=value ...]

An ITEM is a scenario's name, optionally with arguments of its own: `name:key=value:key=value`.
`run_scenarios(SCENARIOS)` runs the items one after another in the same process group (one
launch, one start-up): it calls SCENARIOS[name](dist, args), where args holds "out" (OUT), each
shared key=value and then the item's own, and rank 0 writes what it returns to OUT/<ITEM>.json
(OUT/<name>.json for an item without arguments). A scenario computes its results with
collectives, so the file exists only if every rank got through; a scenario that returns None
writes nothing (it tests a failure, and runs alone: the launch fails).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import phalanx

Scenario = Callable[[phalanx.Dist, dict[str, str]], Any]


def parse_item(item: str) -> tuple[str, dict[str, str]]:
    """`name:key=value:key=value` -> (name, {key: value})."""
    name, *pairs = item.split(":")
    return name, dict(p.split("=", 1) for p in pairs)


def run_scenarios(scenarios: Mapping[str, Scenario], *, timeout_s: float = 60.0) -> None:
    """Run the items named on the command line, in order, on every rank; `timeout_s` bounds
    each collective, so that a rank that failed does not leave its peers waiting for minutes."""
    items, out = sys.argv[1].split(","), Path(sys.argv[2])
    shared = {"out": str(out), **dict(a.split("=", 1) for a in sys.argv[3:])}
    out.mkdir(parents=True, exist_ok=True)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=timeout_s)) as d:
        for item in items:
            name, own = parse_item(item)
            result = scenarios[name](d, {**shared, **own})
            if d.env.is_main_process and result is not None:
                (out / f"{item}.json").write_text(json.dumps(result))
