"""Render a SubmitConfig into an sbatch script: header, environment, rendezvous, launch.

Pure text: nothing here touches SLURM. Every user value is either an `#SBATCH` value (newlines
refused) or shell-quoted; secrets appear only by name. The preemption contract (docs/
checkpoints.md, "Preemption"): SIGUSR2 ahead of the time limit reaches every task; tasks start
with it ignored until phalanx installs its flag-only handler; rank 0 requeues after the
checkpoint.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import UsageError
from phalanx.submit.config import EnvSection, SubmitConfig

# Started with SIGUSR2 ignored: a signal that arrives before Python installed phalanx's handler
# must not kill the task (the default action of USR2 is to terminate).
IGNORE_USR2 = ("bash", "-c", 'trap "" USR2; exec "$@"', "phalanx-task")

FIRST_NODE_ADDR = """\
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR="${MASTER_ADDR:-$first_node}\""""


TRIAL_CONFIG = '"$trial_dir/config.yaml"'
"""A sweep task's config, expanded by the job script from SLURM_ARRAY_TASK_ID."""

# A batch script is a non-login shell: `module` exists only if the submitting shell exported it.
MODULE_INIT = """\
if ! type module >/dev/null 2>&1; then
  for init in /usr/share/modules/init/bash /usr/share/lmod/lmod/init/bash \\
      /etc/profile.d/modules.sh; do
    if [ -f "$init" ]; then source "$init"; break; fi
  done
fi"""


@dataclass(frozen=True, kw_only=True)
class Job:
    """One submission: the config plus what submit decided (paths, the command)."""

    config: SubmitConfig
    run_dir: Path
    workdir: Path
    """Where the job runs: the code snapshot, or the submit directory."""
    script: str
    """The training script, relative to workdir (or absolute)."""
    args: tuple[str, ...]
    trials: int = 0
    """A sweep: a job array of this many independent runs; task K runs the config that
    `phalanx sweep` resolved into <run dir>/trial-K/config.yaml."""


def sbatch_value(key: str, value: str) -> str:
    """A value for an `#SBATCH` line: SLURM reads it up to the end of the line, unquoted."""
    if "\n" in value or "\r" in value:
        raise UsageError(f"submit {key} contains a newline; #SBATCH values must be one line")
    return value


def render(job: Job) -> str:
    """The whole sbatch script."""
    parts = [
        "#!/bin/bash",
        "# Written by `phalanx submit`; re-submit with: sbatch <this file>",
        *header(job),
        "",
        "set -eo pipefail",
        *environment(job.config.env),
        "",
        f"cd {shlex.quote(str(job.workdir))}",
        FIRST_NODE_ADDR,
        *launch(job),
        "",
    ]
    return "\n".join(parts)


def sbatch_options(job: Job) -> list[str]:
    """Every sbatch option of the job, as `--key=value` (or a bare `--flag`)."""
    cfg = job.config.job
    mode = job.config.launch.mode
    tasks = 1 if mode == "torchrun" else cfg.tasks_per_node
    options: list[tuple[str, str]] = [
        ("job-name", cfg.name or Path(job.script).stem),
        ("nodes", str(cfg.nodes)),
        ("ntasks-per-node", str(tasks)),
        ("time", cfg.time),
        ("output", str(job.run_dir / ("slurm-%A_%a.out" if job.trials else "slurm-%j.out"))),
        ("open-mode", "append"),  # a requeued job appends to the same log
    ]
    if cfg.cpus_per_task:
        per_task = cfg.cpus_per_task * (cfg.tasks_per_node if mode == "torchrun" else 1)
        options.append(("cpus-per-task", str(per_task)))
    if cfg.gpus_per_node:
        gpus = ("gres", f"gpu:{cfg.gpus_per_node}")
        options.append(gpus if cfg.gpu_flag == "gres" else ("gpus-per-node", gpus[1][4:]))
    for key in ("mem", "partition", "account", "qos", "constraint", "reservation", "mail_user"):
        if getattr(cfg, key):
            options.append((key.replace("_", "-"), getattr(cfg, key)))
    if cfg.mail_type:
        options.append(("mail-type", cfg.mail_type))
    if cfg.signal:
        options.append(("signal", cfg.effective_signal))
    flags = [f"--{key}={sbatch_value(f'job.{key}', value)}" for key, value in options]
    flags += ["--exclusive"] if cfg.exclusive else []
    flags += ["--requeue" if cfg.requeue else "--no-requeue"]
    flags += [f"--array=0-{job.trials - 1}"] if job.trials else []
    return flags + [sbatch_value("job.extra", item) for item in cfg.extra]


def fits_directive(option: str) -> bool:
    """sbatch splits `#SBATCH` lines at blanks and strips double quotes, with no escape:
    a value with blanks or quotes only reaches SLURM intact as a command-line argument."""
    return not any(c.isspace() or c in "\"'\\" for c in option)


def command_line_options(job: Job) -> list[str]:
    """The options that cannot be `#SBATCH` lines; `submit` passes them to sbatch as argv."""
    return [option for option in sbatch_options(job) if not fits_directive(option)]


def header(job: Job) -> list[str]:
    """The #SBATCH lines: resources, logs into the run directory, preemption defaults."""
    lines = []
    for option in sbatch_options(job):
        if fits_directive(option):
            lines.append(f"#SBATCH {option}")
        else:
            key = option.split("=", 1)[0]
            lines.append(f"# {key} is passed on sbatch's command line (blanks or quotes)")
    return lines


def environment(env: EnvSection) -> list[str]:
    """Modules, venv / conda activation, variables, and the by-name checks of passed ones."""
    lines: list[str] = []
    if env.modules:
        lines.append(MODULE_INIT)
        lines += [f"module use {shlex.quote(path)}" for path in env.module_paths]
        lines += ["module purge", "module load " + " ".join(map(shlex.quote, env.modules))]
    if env.kind == "venv":
        lines.append(f"source {shlex.quote(str(Path(env.venv) / 'bin' / 'activate'))}")
    if env.kind == "conda":
        lines += ['eval "$(conda shell.bash hook)"', f"conda activate {shlex.quote(env.conda)}"]
    for item in env.vars:
        name, _, value = item.partition("=")
        lines.append(f"export {name}={shlex.quote(value)}")
    for name in env.pass_vars:
        # The value travels in sbatch's environment (--export=ALL,NAME), never in this file.
        lines.append(f': "${{{name}:?{name} was not passed to the job (export it before submit)}}"')
    lines += list(env.setup)
    return lines


def launch(job: Job) -> list[str]:
    """Start the ranks in the background and wait: a batch-script trap can then still run."""
    cfg, mode = job.config, job.config.launch.mode
    python = [cfg.launch.python]
    program = [job.script, *job.args]
    lines = []
    if job.trials:
        where = shlex.quote(str(job.run_dir))
        lines.append(f'trial_dir={where}/trial-"$SLURM_ARRAY_TASK_ID"')
        program += ["--config", TRIAL_CONFIG]
    if mode == "srun":
        command = [*_srun(cfg.job.tasks_per_node, cfg.job.cpus_per_task), *IGNORE_USR2]
        command += [*_container(job), *python, *program]
    elif mode == "torchrun":
        per_node = str(cfg.job.tasks_per_node)
        cpus = cfg.job.cpus_per_task * cfg.job.tasks_per_node  # the node's ranks share one task
        command = [*_srun(1, cpus), *IGNORE_USR2, *_container(job)]
        command += [*python, "-m", "phalanx", "run", "-n", per_node, *program]
    else:
        command = [*_mpirun(job), *IGNORE_USR2, *_container(job), *python, *program]
    if mode == "mpirun":  # its ranks have no SLURM step of their own to derive a port from
        lines.append("export MASTER_PORT=$((15000 + SLURM_JOB_ID % 15000))")
    else:
        # srun's --kill-on-bad-exit as a variable: srun reads it, and the tasks can see it, so
        # each task prints a start-up error (srun may stop the first one before it prints).
        lines.append("export SLURM_KILL_BAD_EXIT=1  # srun --kill-on-bad-exit, seen by tasks too")
    if cfg.env.kind == "container" and cfg.env.runtime == "charliecloud":
        lines.append('export USER="${USER:-$(id -un)}"  # ch-run refuses to start without it')
    return [*lines, " ".join(_quote(part) for part in command) + " &", 'wait "$!"']


def _quote(part: str) -> str:
    # The one expansion the script itself adds (a sweep task's config) stays expandable; it is
    # a constant of this module, never a user value.
    return part if part == TRIAL_CONFIG else shlex.quote(part)


def _srun(tasks_per_node: int, cpus_per_task: int) -> list[str]:
    # srun stopped inheriting SLURM_CPUS_PER_TASK in 22.05: pass it explicitly.
    command = ["srun", f"--ntasks-per-node={tasks_per_node}"]
    return command + ([f"--cpus-per-task={cpus_per_task}"] if cpus_per_task else [])


def _mpirun(job: Job) -> list[str]:
    cfg = job.config
    per_node = cfg.job.tasks_per_node
    command = ["mpirun", "-np", str(cfg.job.nodes * per_node), "--map-by", f"ppr:{per_node}:node"]
    command += ["--bind-to", "none", "-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
    return [*command, *cfg.launch.mpirun_args]


def _container(job: Job) -> list[str]:
    env = job.config.env
    if env.kind != "container":
        return []
    binds = [str(job.run_dir), *env.binds]
    if env.runtime == "charliecloud":
        mounts = [f"--bind={b if ':' in b else f'{b}:{b}'}" for b in binds]
        return ["ch-run", *mounts, f"--cd={job.workdir}", env.image, "--"]
    gpu = ["--nv"] if job.config.job.gpus_per_node else []
    where = ["--pwd", str(job.workdir)]
    return [env.runtime, "exec", *gpu, "--bind", ",".join(binds), *where, env.image]
