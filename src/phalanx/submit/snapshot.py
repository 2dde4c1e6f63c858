"""The code snapshot: what a queued or requeued job runs is what was submitted.

In a git work tree the tracked and untracked-but-not-ignored files are copied (so `.venv`,
data and run directories listed in .gitignore stay out), and the commit plus whether the tree
was dirty are recorded. Outside git the directory is copied minus obvious bulk (.git, virtual
environments, caches, run directories). The copy goes to <run dir>/code and the job `cd`s there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from phalanx.errors import UsageError

SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    "runs",
    "wandb",
}
MAX_BYTES = 200 * 1024 * 1024
"""A snapshot larger than this is refused: data or checkpoints are in the code directory."""


def code_root(script: Path, configured: str) -> Path:
    """The directory to snapshot: configured, else the script's git work tree, else its dir."""
    if configured:
        return Path(configured).resolve()
    top = _git(script.parent, "rev-parse", "--show-toplevel")
    return Path(top) if top else script.parent.resolve()


def take(root: Path, target: Path) -> dict[str, object]:
    """Copy `root` into `target` (which must not exist); returns what SNAPSHOT.json records."""
    files = _git_files(root)
    record: dict[str, object] = {"source": str(root)}
    if files is None:
        files = _walk(root)
    else:
        record["commit"] = _git(root, "rev-parse", "HEAD")
        record["dirty"] = bool(_git(root, "status", "--porcelain"))
    size = sum((root / f).stat().st_size for f in files if (root / f).is_file())
    if size > MAX_BYTES:
        raise UsageError(
            f"code snapshot of {root} would copy {size / 2**20:.0f} MiB; keep data and "
            "checkpoints out of it (.gitignore them), set code_dir, or snapshot=none"
        )
    for rel in files:
        source = root / rel
        if source.is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / rel)
    record["files"] = len(files)
    (target / "SNAPSHOT.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _git(cwd: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _git_files(root: Path) -> list[str] | None:
    if not _git(root, "rev-parse", "--show-toplevel"):
        return None
    listing = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted({name for name in listing.split("\0") if name})


def _walk(root: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts) or not path.is_file():
            continue
        found.append(str(rel))
    return sorted(found)
