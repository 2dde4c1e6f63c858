"""The docs site builds with `mkdocs build --strict`: a broken link, anchor, nav entry or
docstring reference fails the suite, and the generated reference pages (CLI, config keys, API)
are rebuilt from the code (docs/_hooks/generate.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.conftest import need
from tests.support.procs import VENV_BIN, base_env, run

ROOT = Path(__file__).parents[2]
# The build imports torch for the API page: a few seconds, too slow for the pure layer.
pytestmark = pytest.mark.dist


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    need(
        importlib.util.find_spec("mkdocs") is not None
        and importlib.util.find_spec("mkdocstrings") is not None,
        "mkdocs (pip install -e '.[docs]')",
    )
    src = str(ROOT / "src")
    pythonpath = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    # NO_MKDOCS_2_WARNING: Material prints a banner about its successor on every build.
    env = base_env({"PYTHONPATH": pythonpath, "NO_MKDOCS_2_WARNING": "1"})
    cmd = [str(VENV_BIN / "mkdocs"), "build", "--strict", "-d", str(tmp_path / "site")]
    result = run(cmd, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("reference/cli", "reference/config", "reference/api"):
        assert (site / page / "index.html").is_file(), page
    cli = (site / "reference/cli/index.html").read_text()
    assert "phalanx submit" in cli and "--gpus-per-node" in cli
    api = (site / "reference/api/index.html").read_text()
    assert 'id="phalanx.train.trainer.Trainer"' in api
