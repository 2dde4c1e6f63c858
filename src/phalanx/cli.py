"""The `phalanx` command: a thin argparse router. No torch import at module level."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from phalanx.doctor.cli import cmd_doctor
from phalanx.env import FIELDS, LAUNCHERS, detect, report_start_error
from phalanx.errors import UsageError
from phalanx.submit.cli import HANDLERS as JOB_HANDLERS
from phalanx.submit.cli import add_parsers as add_job_parsers
from phalanx.sweep.cli import add_parser as add_sweep_parser
from phalanx.sweep.cli import cmd_sweep
from phalanx.top.cli import add_top_parser, cmd_top


class _Parser(argparse.ArgumentParser):
    """Usage errors as ONE line and exit code 2, instead of argparse's usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _add_run(sub: argparse._SubParsersAction[_Parser]) -> None:
    run = sub.add_parser(
        "run",
        help="start N processes per node through torchrun (c10d rendezvous across nodes)",
        description="Start the script on N local processes (torch.distributed.run underneath). "
        "Under 'srun --ntasks-per-node=1' the multi-node flags are filled in from SLURM.",
    )
    run.add_argument(
        "-n",
        "--nproc-per-node",
        type=int,
        required=True,
        metavar="N",
        help="processes on this node (one per GPU)",
    )
    run.add_argument("--nnodes", default="1", metavar="M|MIN:MAX",
                     help="number of nodes; MIN:MAX is elastic: a lost node's peers restart "
                     "without it (needs --max-restarts), a returning node joins at the next "
                     "restart")  # fmt: skip
    run.add_argument(
        "--node-rank",
        type=int,
        default=None,
        metavar="K",
        help="this node's index; node 0 hosts the rendezvous (an elastic job cannot lose it)",
    )
    run.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="rendezvous on the first node (needed with --nnodes > 1)",
    )
    run.add_argument("--rdzv-id", default="phalanx", help="id shared by all nodes of one job")
    run.add_argument("--max-restarts", type=int, default=0, help="elastic restarts on failure")
    run.add_argument("--rdzv-conf", default="", metavar="KEY=VALUE,...",
                     help="c10d rendezvous settings (seconds, counts), e.g. "
                     "last_call_timeout=5,keep_alive_interval=1: how fast a lost node is "
                     "noticed")  # fmt: skip
    run.add_argument("--no-slurm", action="store_true", help="ignore SLURM variables")
    run.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module")
    run.add_argument("script", help="training script (or module with -m)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")


def _add_info(sub: argparse._SubParsersAction[_Parser]) -> None:
    info = sub.add_parser(
        "info",
        help="print the environment this process detects (rank, nodes, launcher...)",
        description="Print the detected environment of this process. Fields: " + ", ".join(FIELDS),
    )
    info.add_argument("--json", action="store_true", help="one JSON object (stable field names)")
    info.add_argument(
        "--launcher",
        default="auto",
        choices=("auto", *LAUNCHERS),
        help="force a launcher instead of detecting it",
    )
    info.add_argument("--no-slurm", action="store_true", help="ignore SLURM variables")


def _add_export(sub: argparse._SubParsersAction[_Parser]) -> None:
    export = sub.add_parser(
        "export",
        help="write a checkpoint's model weights for inference (torch file or safetensors)",
        description="Write the model weights of a checkpoint (a run, checkpoints or step-N "
        "directory; full or sharded) as one plain state dict, loadable with "
        "torch.load(OUT, weights_only=True), or with --format safetensors as a Hugging Face "
        "directory (shards + model.safetensors.index.json). A directory with several steps "
        "gives its newest valid one. Sharded checkpoints unpickle DCP metadata: export "
        "trusted ones only.",
    )
    export.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="checkpoint to read")
    export.add_argument(
        "out", metavar="OUT", help="file (torch) or directory (safetensors) to write, replaced "
        "atomically",
    )  # fmt: skip
    export.add_argument(
        "--format", default="torch", choices=("torch", "safetensors", "peft"),
        help="torch: one state dict file; safetensors: a Hugging Face directory, written "
        "shard by shard (needs pip install 'phalanx[hf]'); peft: a peft model's adapters "
        "(adapter_model.safetensors, adapter_config.json; needs pip install 'phalanx[lora]')",
    )  # fmt: skip
    export.add_argument(
        "--merge-adapters", action="store_true",
        help="with --format safetensors: a peft model with its adapters merged into its "
        "weights, loadable with from_pretrained (needs peft)",
    )  # fmt: skip
    export.add_argument(
        "--model-dir", default=None, metavar="DIR",
        help="peft, --merge-adapters: the model's config.json and adapter_config.json (default: "
        "the run directory's model/, written by the Trainer)",
    )  # fmt: skip
    export.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE",
        help="safetensors: largest shard file, e.g. 5GB, 500MB (default 5GB)",
    )  # fmt: skip
    export.add_argument(
        "--hf-config", default=None, metavar="DIR",
        help="safetensors: copy config.json (and generation_config.json) from this Hugging "
        "Face model directory, so OUT loads with from_pretrained",
    )  # fmt: skip


def _add_plot(sub: argparse._SubParsersAction[_Parser]) -> None:
    plot = sub.add_parser(
        "plot",
        help="draw the curves of one or more runs (overlaid) as PNG files",
        description="Read each run directory's metrics.jsonl and write one PNG per metric "
        "group (loss, eval metrics, throughput), every run's curve on it.",
    )
    plot.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories")
    plot.add_argument("-o", "--out", default="plots", metavar="DIR", help="where to write")


def _add_doctor(sub: argparse._SubParsersAction[_Parser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check this node for distributed training; --bandwidth measures all-reduce, "
        "--preflight names slow or failing ranks",
        description="Check this node: versions, GPUs, the detected launcher, shared memory, "
        "open-file limit, host name resolution, SLURM tools, disk space, network, trackers. "
        "Exit code 1 if a check fails. --bandwidth then times all-reduce over N local "
        "processes (under 'srun --ntasks-per-node=1', over every node of the step); "
        "--preflight times a matrix product on each of them and one all-reduce, and names "
        "every rank far slower than the median (exit 1).",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object per check")
    doctor.add_argument("--run-root", default="runs", help="where runs would be written")
    doctor.add_argument("--bandwidth", action="store_true", help="also time all-reduce")
    doctor.add_argument(
        "--preflight",
        action="store_true",
        help="also check every rank's compute and reach (a few seconds)",
    )
    doctor.add_argument("-n", "--nproc-per-node", type=int, default=0, metavar="N",
                        help="processes for --bandwidth and --preflight (default: GPUs, or 2 "
                        "on CPU)")  # fmt: skip
    doctor.add_argument("--sizes-mb", type=float, nargs="+", default=[1.0, 16.0, 64.0],
                        metavar="MB", help="message sizes for --bandwidth")  # fmt: skip
    doctor.add_argument("--iters", type=int, default=20, help="timed all-reduces per size")


def build_parser() -> _Parser:
    parser = _Parser(
        prog="phalanx",
        description="Distributed PyTorch training on SLURM clusters and multi-GPU machines.",
    )
    parser.add_argument("--version", action="version", version="phalanx 0.1.0")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    _add_run(sub)
    _add_info(sub)
    _add_export(sub)
    _add_plot(sub)
    _add_doctor(sub)
    _add_probe_data(sub)
    add_sweep_parser(sub)
    add_job_parsers(sub)
    add_top_parser(sub)
    return parser


def _add_probe_data(sub: argparse._SubParsersAction[_Parser]) -> None:
    probe = sub.add_parser(
        "probe-data",
        help="measure the training data loading of a script (samples/s per num_workers)",
        description="Run SCRIPT until it builds phalanx.Trainer(...), then time its train_data "
        "through the Trainer's own loader for num_workers 0..CPUs and pin_memory.",
    )
    probe.add_argument("--max-workers", type=int, default=None, metavar="K",
                       help="largest num_workers to try (default: the CPUs)")  # fmt: skip
    probe.add_argument("--batches", type=int, default=50, metavar="B",
                       help="batches timed per setting, after the first")  # fmt: skip
    probe.add_argument("--step-ms", type=float, default=None, metavar="MS",
                       help="your training step's time: recommend the setting lightest on the "
                       "training process among those that keep up with it")  # fmt: skip
    probe.add_argument("script", help="the training script")
    probe.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")


def _probe_data_usage(args: argparse.Namespace) -> str:
    """What is wrong with probe-data's options, if anything ("": nothing)."""
    if args.batches < 1:
        return f"--batches {args.batches}: time at least 1 batch per setting"
    if args.max_workers is not None and args.max_workers < 0:
        return f"--max-workers {args.max_workers}: give 0 or more (0: loading in the process only)"
    # `not x > 0` refuses NaN too; inf would accept every setting as fast enough.
    if args.step_ms is not None and not (args.step_ms > 0 and math.isfinite(args.step_ms)):
        return f"--step-ms {args.step_ms:g}: give the training step's time in ms (a number > 0)"
    if not os.path.isfile(args.script):
        return f"script '{args.script}' not found; pass the training script's path"
    return ""


def _cmd_probe_data(args: argparse.Namespace) -> int:
    from phalanx.probe_data import sweep

    wrong = _probe_data_usage(args)
    if wrong:
        raise UsageError(wrong)
    print(sweep(args.script, list(args.args), max_workers=args.max_workers, batches=args.batches,
                step_ms=args.step_ms))  # fmt: skip
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from phalanx.launch import local

    min_nodes, nnodes = local.parse_nnodes(args.nnodes)
    spec = local.RunSpec(
        nproc_per_node=args.nproc_per_node,
        script=args.script,
        script_args=tuple(args.args),
        module=args.module,
        nnodes=nnodes,
        min_nodes=min_nodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        max_restarts=args.max_restarts,
        rdzv_conf=tuple(item for item in args.rdzv_conf.split(",") if item),
    )
    plan = local.plan_run(spec, os.environ, slurm=not args.no_slurm)
    local.exec_torchrun(local.resolve_config(plan))
    return 0  # not reached: exec_torchrun replaces the process


def _cmd_info(args: argparse.Namespace) -> int:
    env = detect(launcher=args.launcher, slurm=not args.no_slurm)
    if args.json:
        print(json.dumps(env.as_dict()))
    else:
        for name, value in env.as_dict().items():
            print(f"{name:>16}: {value}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from phalanx.checkpoint.export import export_weights
    from phalanx.checkpoint.export_safetensors import parse_size

    if args.merge_adapters and args.format != "safetensors":
        raise UsageError("--merge-adapters writes a whole model: add --format safetensors")
    if args.format == "peft" or args.merge_adapters:
        from phalanx.checkpoint.export_peft import export_adapters

        model_dir = Path(args.model_dir) if args.model_dir else None
        source, count = export_adapters(Path(args.checkpoint_dir), Path(args.out),
                                        merge=args.merge_adapters, model_dir=model_dir)  # fmt: skip
        print(f"exported {count} tensors of {source} to {args.out}")
        return 0
    source, count = export_weights(
        Path(args.checkpoint_dir), Path(args.out), format=args.format,
        max_shard_bytes=parse_size(args.max_shard_size),
        hf_config=Path(args.hf_config) if args.hf_config else None,
    )  # fmt: skip
    print(f"exported {count} tensors of {source} to {args.out}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from phalanx.track.plots import plot_runs

    out = Path(args.out)
    try:
        written = plot_runs([Path(d) for d in args.run_dirs], out)
    except OSError as error:  # -o names a file, or a folder this user cannot write
        reason = error.strerror or error
        raise UsageError(f"cannot write plots into '{out}': {reason}; pass -o DIR") from None
    for path in written:
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `phalanx` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    handlers = {
        "run": _cmd_run, "info": _cmd_info, "export": _cmd_export, "plot": _cmd_plot,
        "doctor": cmd_doctor, "sweep": cmd_sweep, "probe-data": _cmd_probe_data,
        "top": cmd_top, **JOB_HANDLERS,
    }  # fmt: skip
    try:
        return handlers[args.command](args)
    except UsageError as error:
        # The same mistake on every process: phalanx.env.start_error decides who prints it.
        report_start_error(f"phalanx {args.command}: error: {error}", os.environ)
        return 2
