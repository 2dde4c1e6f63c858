"""checkpoint.async_writer: validated in one line; the refusal to train inside a process that
only re-imports the script (what the process writer's spawn does to an unguarded one); and the
filter that keeps the writer process's INFO lines out of the run's output."""

from __future__ import annotations

import logging
import sys

import pytest

import phalanx
from phalanx.config import load
from phalanx.env.spawned import _not_writer_chatter
from tests.support.procs import run


def test_unknown_writer_is_a_one_line_error_naming_the_choices() -> None:
    with pytest.raises(phalanx.UsageError) as error:
        load(phalanx.TrainerConfig, overrides=["checkpoint.async_writer=disk"])
    assert "checkpoint.async_writer='disk' is not one of process, thread" in str(error.value)
    assert "\n" not in str(error.value)


def test_default_writer_is_the_process() -> None:
    assert load(phalanx.TrainerConfig, overrides=[]).checkpoint.async_writer == "process"


REIMPORT = """
script = "from phalanx.env.spawned import refuse_spawned_import\\n"
script += "refuse_spawned_import()\\nprint('went on')\\n"
exec(compile(script, "train.py", "exec"), {"__name__": NAME})
print("returned")
"""


@pytest.mark.parametrize("name", ["__mp_main__", "__main__"])
def test_spawned_reimport_exits_2_with_the_fix(name: str) -> None:
    code = REIMPORT.replace("NAME", repr(name))
    result = run([sys.executable, "-c", code], timeout=60)
    if name == "__mp_main__":  # module-level code of a script a spawned process imports
        assert result.returncode == 2
        assert 'put the training under `if __name__ == "__main__":`' in result.stderr
        assert result.stderr.count("\n") == 1 and "went on" not in result.stdout
    else:
        assert result.returncode == 0 and result.stdout.split() == ["went", "on", "returned"]


def record(level: int, path: str, name: str = "root") -> logging.LogRecord:
    return logging.LogRecord(name, level, path, 1, "Waiting for checkpoint save request", (), None)


def test_writer_filter_drops_only_torch_checkpoint_info_on_the_root_logger() -> None:
    dcp = "/venv/site-packages/torch/distributed/checkpoint/_async_process_executor.py"
    keep = _not_writer_chatter
    assert not keep(record(logging.INFO, dcp))
    assert keep(record(logging.WARNING, dcp)) and keep(record(logging.ERROR, dcp))
    assert keep(record(logging.INFO, "/home/me/train.py"))  # the user's own root logging
    assert keep(record(logging.INFO, dcp, name="phalanx.checkpoint"))


QUIET = """
import logging, sys, types
if SPAWNED:
    sys.modules["__mp_main__"] = types.ModuleType("__mp_main__")
import phalanx
print(len(logging.getLogger().filters))
"""


@pytest.mark.parametrize("spawned", [True, False])
def test_import_in_a_spawned_process_installs_the_filter_once(spawned: bool) -> None:
    result = run([sys.executable, "-c", QUIET.replace("SPAWNED", str(spawned))], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == (["1"] if spawned else ["0"])
