"""`phalanx sweep` here: a 4-trial grid, one trial after another, summarised and ranked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, base_env, run
from tests.support.sweeps import check_summary, write_spec

pytestmark = pytest.mark.dist


@pytest.mark.timeout(300)
def test_local_grid_sweep_runs_every_trial_and_ranks_them(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    result = run([str(VENV_BIN / "phalanx"), "sweep", str(spec), "--root", str(tmp_path / "runs")],
                 timeout=280, env=base_env(), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"sweep directory: (\S+) \(4 trials\)", result.stdout)
    assert found, result.stdout
    sweep_dir = Path(found.group(1))
    check_summary(sweep_dir, result.stdout)
    again = run([str(VENV_BIN / "phalanx"), "sweep", "--summary", str(sweep_dir)], timeout=60,
                env=base_env())  # fmt: skip
    assert (
        again.returncode == 0
        and again.stdout.split("\n")[1] == result.stdout.split("trial  ")[1].split("\n")[1]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"parameters": {"train.no_such_key": [1, 2]}},
            "config key 'train.no_such_key' is unknown",
        ),
        ({"method": "bayes"}, "sweep method='bayes' is not one of: grid, random"),
        ({"parameters": {"lr": [1]}}, "must be a dotted config key"),
    ],
)
def test_bad_sweep_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    import yaml

    spec = write_spec(tmp_path)
    spec.write_text(yaml.safe_dump({**yaml.safe_load(spec.read_text()), **change}))
    result = run([str(VENV_BIN / "phalanx"), "sweep", str(spec), "--root", str(tmp_path / "runs")],
                 timeout=120, env=base_env(), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not list((tmp_path / "runs").glob("sweep-*"))
