"""The command line every scenario worker shares:

    phalanx run -n N some_worker.py SCENARIO OUT [key=value ...]

`run_scenarios(SCENARIOS)` calls SCENARIOS[SCENARIO](dist, args), where args holds "out" (OUT)
and each key=value, and rank 0 writes what it returns to OUT/<SCENARIO>.json. A scenario
computes its results with collectives, so the file exists only if every rank got through; a
scenario that returns None writes nothing (it tests a failure).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import phalanx

Scenario = Callable[[phalanx.Dist, dict[str, str]], Any]


def run_scenarios(scenarios: Mapping[str, Scenario], *, timeout_s: float = 60.0) -> None:
    """Run the scenario named on the command line on every rank; `timeout_s` bounds each
    collective, so that a rank that failed does not leave its peers waiting for minutes."""
    name, out = sys.argv[1], Path(sys.argv[2])
    args = {"out": str(out), **dict(a.split("=", 1) for a in sys.argv[3:])}
    out.mkdir(parents=True, exist_ok=True)
    with phalanx.distributed(phalanx.DistConfig(timeout_s=timeout_s)) as d:
        result = scenarios[name](d, args)
        if d.env.is_main_process and result is not None:
            (out / f"{name}.json").write_text(json.dumps(result))
