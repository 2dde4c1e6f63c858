"""The Trainer is made of blocks that do not know it: no module of train/ but the Trainer's own
imports it, and the checkpoint layer imports nothing from the loop above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import phalanx

SRC = Path(phalanx.__file__).parent
pytestmark = pytest.mark.pure


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, TYPE_CHECKING blocks and function bodies included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_only_the_trainers_file_and_the_package_import_the_trainer() -> None:
    helpers = [
        p for p in (SRC / "train").glob("*.py") if p.name not in ("trainer.py", "__init__.py")
    ]
    assert helpers
    for path in helpers:
        bad = {m for m in imported_modules(path) if m.startswith("phalanx.train.trainer")}
        assert not bad, f"{path.name} imports {bad}"


def test_the_checkpoint_layer_imports_nothing_from_train() -> None:
    for path in (SRC / "checkpoint").glob("*.py"):
        bad = {m for m in imported_modules(path) if m.startswith("phalanx.train")}
        assert not bad, f"checkpoint/{path.name} imports {bad}"
