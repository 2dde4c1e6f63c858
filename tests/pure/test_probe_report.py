"""`phalanx probe-data`'s recommendation from measured rows (pure: no loader runs here)."""

from __future__ import annotations

from phalanx.probe_data import Row, report


def _row(workers: int, samples_per_s: float, cpu_ms: float, pin: bool = False) -> Row:
    return Row(workers, pin, samples_per_s, first_batch_s=0.1, process_cpu_ms=cpu_ms)


def test_without_a_step_time_the_fastest_is_recommended_and_a_lighter_one_named() -> None:
    rows = [_row(0, 8_000, 0.40), _row(1, 4_000, 0.105), _row(2, 6_000, 0.10)]
    lines = report(rows, 64).splitlines()
    assert lines[0].split()[-3:] == ["process", "CPU", "ms/batch"]
    assert lines[1].endswith("<- fastest")
    assert lines[-2].startswith("recommended: data.num_workers=0 data.pin_memory=false;")
    assert "longer than 8.0 ms" in lines[-2]  # 64 samples at 8,000/s
    # 2 workers cost least, 1 worker within 10% of it: one cost, and the fewer workers win.
    assert lines[-1].startswith("lightest on the training process: data.num_workers=1 ")
    assert "longer than 16.0 ms" in lines[-1]


def test_no_lighter_line_when_the_fastest_is_as_light() -> None:
    rows = [_row(0, 8_000, 0.10), _row(1, 4_000, 0.095)]
    lines = report(rows, 64).splitlines()
    assert lines[-1].startswith("recommended: data.num_workers=0")


def test_a_step_time_picks_the_lightest_setting_that_keeps_up() -> None:
    rows = [_row(0, 8_000, 0.40), _row(1, 1_000, 0.05), _row(2, 6_000, 0.10, pin=True)]
    # A 20 ms step: 1 worker (64 ms a batch) is too slow, 2 workers (10.7 ms) keep up.
    last = report(rows, 64, step_ms=20.0).splitlines()[-1]
    assert last.startswith("recommended: data.num_workers=2 data.pin_memory=true: the lightest")
    # A step longer than every setting's batch time: the lightest of all.
    assert "num_workers=1 " in report(rows, 64, step_ms=100.0).splitlines()[-1]


def test_a_step_time_no_setting_keeps_up_with_gets_the_fastest() -> None:
    rows = [_row(0, 8_000, 0.40), _row(1, 1_000, 0.05)]
    last = report(rows, 64, step_ms=1.0).splitlines()[-1]
    assert last.startswith("recommended: data.num_workers=0 data.pin_memory=false: no setting")
