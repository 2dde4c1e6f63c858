"""`phalanx env`: the set-up artefacts that match a submit configuration.

- venv: a job script that builds the virtual environment ON a compute node, with the profile's
  modules loaded (login nodes often have another CPU, driver or library stack);
- conda: an environment file (keep the environment under $WORK / project space, not $HOME);
- apptainer: a definition file for the project's dependencies.

All three install the same things: torch pinned to the version running here (so the cluster
gets what was tested), the requirements file if given, and the project itself when the code
directory is a Python project (pyproject.toml / setup.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from phalanx.submit.config import SubmitConfig
from phalanx.submit.render import MODULE_INIT, sbatch_value


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What to install: versions and paths, all decided by the caller."""

    torch: str
    """The torch requirement, e.g. torch==2.11.0."""
    phalanx: str = "phalanx"
    """The phalanx requirement (pinned by the caller to the version running here)."""
    python: str = "3.11"
    """Python version (conda and apptainer)."""
    requirements: Path | None = None
    project: Path | None = None
    """A directory with pyproject.toml / setup.py, installed as a package."""


def pip_args(recipe: Recipe, *, project_at: str | None = None) -> list[str]:
    args = [recipe.torch, recipe.phalanx]
    if recipe.requirements is not None:
        args += ["-r", str(recipe.requirements)]
    if recipe.project is not None:
        args.append(project_at or str(recipe.project))
    return args


def venv_job(config: SubmitConfig, recipe: Recipe, target: Path) -> str:
    """An sbatch script that builds `target` on one compute node of the profile's partition."""
    cfg, env = config.job, config.env
    lines = ["#!/bin/bash", "# Written by `phalanx env venv`: builds the venv on a compute node."]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", target.name)  # a directive holds no blanks
    lines += [f"#SBATCH --job-name=build-venv-{name}",
              "#SBATCH --nodes=1", "#SBATCH --ntasks=1", "#SBATCH --time=1:00:00"]  # fmt: skip
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(cfg, key)
        if value:
            lines.append(f"#SBATCH --{key}={sbatch_value(f'job.{key}', value)}")
    lines += ["", "set -eo pipefail"]
    if env.modules:
        lines.append(MODULE_INIT)
        lines += [f"module use {shlex.quote(p)}" for p in env.module_paths]
        lines += ["module purge", "module load " + " ".join(map(shlex.quote, env.modules))]
    venv = shlex.quote(str(target))
    lines += [
        f"python3 -m venv {venv}",
        f"{venv}/bin/python -m pip install --upgrade pip",
        f"{venv}/bin/python -m pip install " + " ".join(map(shlex.quote, pip_args(recipe))),
        f"{venv}/bin/python -c 'import torch, phalanx; print(torch.__version__, "
        "torch.cuda.is_available())'",
        "",
    ]
    return "\n".join(lines)


def conda_file(recipe: Recipe, name: str) -> str:
    """environment.yml: conda provides Python, pip the rest (the wheels torch publishes)."""
    pip = pip_args(recipe)
    pip_lines = "\n".join(f"      - {item}" for item in _one_per_line(pip))
    return (
        "# Written by `phalanx env conda`. Create it under project space, not $HOME:\n"
        f"#   conda env create -f environment.yml -p $WORK/envs/{name}\n"
        f"name: {name}\n"
        "channels:\n  - conda-forge\n"
        f"dependencies:\n  - python={recipe.python}\n  - pip\n  - pip:\n{pip_lines}\n"
    )


def apptainer_def(recipe: Recipe) -> str:
    """An Apptainer definition: a Python base image plus the same pip installs."""
    files = []
    phalanx = recipe.phalanx
    if phalanx.startswith("/"):  # a local checkout: copied into the image first
        files.append(f"    {phalanx} /opt/phalanx/phalanx")
        phalanx = "/opt/phalanx/phalanx"
    if recipe.requirements is not None:
        files.append(f"    {recipe.requirements} /opt/phalanx/requirements.txt")
    if recipe.project is not None:
        files.append(f"    {recipe.project} /opt/phalanx/project")
    pip = pip_args(
        Recipe(
            torch=recipe.torch,
            phalanx=phalanx,
            requirements=Path("/opt/phalanx/requirements.txt") if recipe.requirements else None,
            project=Path("/opt/phalanx/project") if recipe.project else None,
        )
    )
    text = [
        "# Written by `phalanx env apptainer`. Build: apptainer build image.sif phalanx.def",
        "Bootstrap: docker",
        f"From: python:{recipe.python}-slim",
        "",
    ]
    if files:
        text += ["%files", *files, ""]
    text += [
        "%post",
        "    python -m pip install --no-cache-dir --upgrade pip",
        "    python -m pip install --no-cache-dir " + " ".join(map(shlex.quote, pip)),
        "",
        "%environment",
        "    export PYTHONUNBUFFERED=1",
        "",
        "%test",
        "    python -c 'import torch, phalanx'",
        "",
    ]
    return "\n".join(text)


def _one_per_line(args: list[str]) -> list[str]:
    """pip arguments as environment.yml list items (`-r FILE` stays one item)."""
    items, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "-r":
            items.append(f"-r {args[i + 1]}")
            skip = True
        else:
            items.append(arg)
    return items
