"""The public API is pinned: an export is added or removed here on purpose (STYLE.md, 3), and
every export carries its own docstring (the API reference of the docs site renders them)."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import phalanx

EXPECTED = {
    # Configs: the sections of a run, subclassed or composed by the user.
    "Config", "TrainerConfig", "DistConfig", "RunConfig", "TrainConfig", "DataConfig",
    "CheckpointConfig", "TrackConfig", "ParallelConfig",
    # Start-up and the process group.
    "init", "distributed", "Dist", "ClusterEnv", "detect", "RunDir", "parse_config", "shutdown",
    # The Trainer.
    "Trainer", "Callback", "TrainState",
    # Building blocks of a hand-written loop.
    "wrap_model", "build_layout", "ParallelLayout", "ModelInit", "WrapOptions",
    "unwrap", "model_state_dict", "Precision", "NanGuard", "Metrics", "StepParts",
    "optimizer_step", "masked_step", "evaluate", "linear_cross_entropy", "Checkpointer",
    "CheckpointStore",
    "ControlPlane", "PreemptionWatcher", "HangWatch", "make_train_loader", "make_eval_loader",
    "GlobalOrderSampler", "EvalSampler", "ShardedIterable", "seed_everything",
    # Collectives.
    "all_gather_object", "all_reduce_scalars", "barrier", "broadcast_object", "gather_object",
    "main_process_first",
    # Errors a caller may catch.
    "UsageError", "NonFiniteError", "RunInterrupted",
    "__version__",
}  # fmt: skip


def test_exports_are_the_documented_ones() -> None:
    assert set(phalanx.__all__) == EXPECTED
    assert len(phalanx.__all__) == len(EXPECTED), "a name is listed twice in phalanx.__all__"


def _own_doc(obj: object) -> str:
    """The object's own docstring: not one inherited from a base class, and not the signature
    that dataclasses write when a class has none."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    doc = (doc or "").strip()
    name = getattr(obj, "__name__", "")
    return "" if doc.startswith(f"{name}(") else doc


def test_every_export_has_a_docstring() -> None:
    missing = [
        name
        for name in phalanx.__all__
        if name != "__version__" and not _own_doc(getattr(phalanx, name))
    ]
    assert not missing, f"exports without a docstring of their own: {missing}"


def test_one_naming_scheme() -> None:
    for name in phalanx.__all__:
        obj = getattr(phalanx, name)
        if inspect.isclass(obj):
            assert name[0].isupper() and "_" not in name, name
        elif callable(obj):
            assert name == name.lower(), name


def test_old_import_paths_still_work() -> None:
    from phalanx.lifecycle.preemption import RunInterrupted
    from phalanx.train import NonFiniteError, Precision, unwrap
    from phalanx.train.guard import NanGuard

    assert phalanx.RunInterrupted is RunInterrupted
    assert phalanx.NonFiniteError is NonFiniteError
    assert (phalanx.Precision, phalanx.unwrap, phalanx.NanGuard) == (Precision, unwrap, NanGuard)


def test_import_phalanx_does_not_import_torch() -> None:
    # The CLI's --help and the job-script paths import phalanx; torch costs seconds there.
    code = "import sys, phalanx; phalanx.CheckpointConfig; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def _type_checking_imports(package: str) -> set[tuple[str, str]]:
    """(module, name) of every import under `if TYPE_CHECKING:` in the package's __init__."""
    source = Path(importlib.import_module(package).__file__ or "").read_text()
    found = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module, ast.unparse(stmt)
                found |= {(stmt.module, alias.name) for alias in stmt.names}
    return found


def test_type_checkers_see_the_exports_table() -> None:
    # Type checkers cannot run the tables, so each package repeats them as imports; one drift
    # would leave a name untyped (or typed from another module) in users' code.
    for package in ("phalanx", "phalanx.checkpoint"):
        module = importlib.import_module(package)
        table = {**vars(module)["_AT_ONCE"], **vars(module)["_ON_FIRST_USE"]}
        expected = {(source, name) for source, names in table.items() for name in names}
        assert _type_checking_imports(package) == expected, package
        assert set(module.__all__) - {"__version__"} == {name for _, name in expected}
