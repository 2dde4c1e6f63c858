"""The CLI surface is frozen: a new option must be added here on purpose (STYLE.md, 3)."""

from __future__ import annotations

import argparse

from phalanx.cli import build_parser

EXPECTED = {
    "run": {
        "-h", "--help", "-n", "--nproc-per-node", "--nnodes", "--node-rank", "--rdzv-endpoint",
        "--rdzv-id", "--max-restarts", "--rdzv-conf", "--no-slurm", "-m", "--module",
    },
    "info": {"-h", "--help", "--json", "--launcher", "--no-slurm"},
    "export": {"-h", "--help", "--format", "--max-shard-size", "--hf-config", "--merge-adapters",
               "--model-dir"},
    "plot": {"-h", "--help", "-o", "--out"},
    "doctor": {"-h", "--help", "--json", "--run-root", "--bandwidth", "--preflight", "-n",
               "--nproc-per-node",
               "--sizes-mb", "--iters"},
    "sweep": {"-h", "--help", "--summary", "--root", "--slurm", "--wait", "--profile",
              "--profiles", "--set"},
    "submit": {
        "-h", "--help", "-N", "--nodes", "-G", "--gpus-per-node", "-n", "--ranks-per-node",
        "-c", "--cpus-per-task", "-t", "--time", "-p", "--partition", "-A", "--account",
        "-J", "--job-name", "--mode", "--set", "--config", "--profile", "--profiles", "--dry-run",
    },
    "env": {"-h", "--help", "--profile", "--profiles", "--set", "--requirements", "--project",
            "--path", "--name", "-o", "--output"},
    "probe-data": {"-h", "--help", "--max-workers", "--batches", "--step-ms"},
    "status": {"-h", "--help"},
    "logs": {"-h", "--help", "-f", "--follow"},
    "cancel": {"-h", "--help"},
    "top": {"-h", "--help", "--interval", "--once"},
}  # fmt: skip


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_cli_options_are_the_documented_ones() -> None:
    subs = _subcommands(build_parser())
    assert set(subs) == set(EXPECTED)
    for name, sub in subs.items():
        options = {opt for action in sub._actions for opt in action.option_strings}
        assert options == EXPECTED[name], name
