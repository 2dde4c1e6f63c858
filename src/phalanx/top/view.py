"""`phalanx top`'s screen: one rich table, redrawn in place on a terminal, printed once when
piped."""

from __future__ import annotations

import sys
import time
from typing import Any

from phalanx.top.snapshot import Snapshot, find_run, read_snapshot


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def rows(snap: Snapshot) -> list[tuple[str, str]]:
    """(label, value) lines of the screen, in order."""
    s, now = snap.status, time.time()
    total = s.get("total_steps") or "?"
    state = s.get("state", "no record yet")
    if s.get("updated"):
        state += f" (updated {_duration(now - s['updated'])} ago)"
    out = [("run", str(snap.run_dir)), ("state", state),
           ("step", f"{s.get('step', 0)} / {total}  epoch {s.get('epoch', 0)}"),
           ("rate", f"{snap.rate:.2f} steps/s" if snap.rate else "-"),
           ("ETA", _duration(snap.eta_s))]  # fmt: skip
    shown = (("loss", "loss", "{:.4g}"), ("samples_per_s", "samples/s", "{:.1f}"),
             ("gpu_mem_gb", "GPU memory", "{:.1f} GiB (rank 0's peak)"))  # fmt: skip
    for key, label, fmt in shown:
        if key in s:
            out.append((label, fmt.format(s[key])))
    out += phase_rows(s)
    ranks = s.get("world_size", "?")
    out.append(("ranks", f"{ranks} on {len(snap.hosts)} node(s): {', '.join(snap.hosts) or '?'}"))
    step, age = snap.checkpoint or (None, None)
    out.append(("checkpoint", f"step {step}, {_duration(age)} ago" if step else "none yet"))
    if snap.job:
        job = snap.job
        where = f"on {job.get('NodeList', '?')}, restarts {job.get('Restarts', '0')}"
        out.append(("SLURM", f"job {job.get('JobId', '?')} {job.get('JobState', '?')} {where}"))
    out += [("event", line) for line in snap.events]
    return out


def phase_rows(status: dict[str, Any]) -> list[tuple[str, str]]:
    """Milliseconds per step by phase: median (max) over ranks, each rank's in small worlds,
    the slowest rank's place and a straggler's line (phalanx.train.phases)."""
    phases = status.get("phases_ms")
    if not phases:
        return []
    out = [("phases", "ms/step, median (max): " + "  ".join(
        f"{name} {v[1]:.1f} ({v[2]:.1f})" for name, v in phases.items()))]  # fmt: skip
    for rank, host, ms in status.get("ranks_ms", []):
        out.append((f"rank {rank}", f"{host}: " + "  ".join(f"{n} {v:.1f}" for n, v in ms.items())))
    if "slowest_where" in status:
        out.append(("slowest", status["slowest_where"]))
    if "straggler" in status:
        out.append(("straggler", status["straggler"]))
    return out


def renderable(snap: Snapshot) -> Any:
    from rich.table import Table

    table = Table(title="phalanx top", show_header=False, expand=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in rows(snap):
        table.add_row(label, value)
    return table


def top(target: str, *, interval_s: float = 2.0, once: bool = False) -> int:
    """Show the run; on a terminal, redraw every `interval_s` until Ctrl-C or the run ends."""
    from rich.console import Console
    from rich.live import Live

    run_dir, job_id = find_run(target)
    console = Console()
    snap = read_snapshot(run_dir, job_id)
    if once or not sys.stdout.isatty() or snap.finished:
        console.print(renderable(snap))
        return 0
    try:
        with Live(renderable(snap), console=console, auto_refresh=False) as live:
            while not snap.finished:
                time.sleep(interval_s)  # the refresh period of the view
                snap = read_snapshot(run_dir, job_id)
                live.update(renderable(snap), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0
