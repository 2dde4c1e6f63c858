"""checkpoint.async_writer: validated in one line; and the refusal to train inside a process
that only re-imports the script (what the process writer's spawn does to an unguarded one)."""

from __future__ import annotations

import sys

import pytest

import phalanx
from phalanx.config import load
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
