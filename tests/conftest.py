"""Test-session rules for every layer.

- Markers pure / dist / cluster / gpu are the test layers (docs/extending.md); each layer has a
  time budget that fails the session when exceeded, so CI stays well under its limit (scaled
  by the machine's measured speed: tests/support/host_speed.py).
- `need(service, reason)`: skip when a service is missing, but FAIL under CI=true, where .ci/run
  must have installed and started everything.
- Tests may not leak environment variables (they would fake a launcher for later tests).
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.support import host_speed

# Seconds per layer, summed over the tests' own durations, on the 2-core CI machine. `make test`
# runs pure and dist on two workers (pytest-xdist): both workers' tests count, each slowed by
# the other (a fresh-clone CI run: dist 1,443 s of test time in 749 s of wall time, against
# ~1,100 s run alone), so these sums are about twice the wall time. The cluster layer runs
# alone (417-622 s measured). On a host of normal speed, dist takes 1,820-1,868 s of test time
# (949-974 s wall), cluster 478-574 s, the whole run 1,619-1,702 s. dist's budget is derived
# from CI's 30 minutes: set-up ~150 s + cluster ~600 s leave ~1,050 s of wall for pure and
# dist, ~2,050 s of their test time.
# The budgets leave room for a loaded machine without hiding a test that suddenly takes minutes.
# On a slower machine they grow by its measured slowdown (tests/support/host_speed.py, up to 4x).
LAYER_BUDGET_S = {"pure": 120.0, "dist": 2000.0, "cluster": 750.0, "gpu": 600.0}
_spent: dict[str, float] = defaultdict(float)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def need(ok: bool, what: str) -> None:
    """Skip locally when `what` is missing; in CI a missing service is a failure."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI=true but {what} is missing: .ci/run must install/start it")
    pytest.skip(f"{what} is missing")


def need_command(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    need(not missing, f"command(s) {', '.join(missing)}")


# Variables torch's compiler and kernel libraries set for themselves once per process (cache and
# tool paths, OpenMP runtime flags): no launcher reads them, and removing them would only make
# the next compile set them again.
_TORCH_OWN = ("TORCHINDUCTOR_", "_TORCHINDUCTOR_", "TRITON_", "TORCH_WARM_POOL", "CUBLAS_", "KMP_")


def _watched() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k != "PYTEST_CURRENT_TEST" and not k.startswith(_TORCH_OWN)
    }


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    before = _watched()
    yield
    now = _watched()
    leaked = set(now) ^ set(before)
    changed = {k for k in set(now) & set(before) if now[k] != before[k]}
    for key in leaked | changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    assert not (leaked | changed), f"test leaked environment variables: {sorted(leaked | changed)}"


def _layer(item: pytest.Item) -> str:
    for name in LAYER_BUDGET_S:
        if item.get_closest_marker(name):
            return name
    return "pure"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in LAYER_BUDGET_S):
            item.add_marker(pytest.mark.pure)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    layer = next((k for k in LAYER_BUDGET_S if k in report.keywords), "pure")
    _spent[layer] += report.duration


def _host_factor(terminalreporter: pytest.TerminalReporter) -> float:
    """1, or this machine's slowdown once a layer is over its budget (only then: measuring
    costs ~5-15 s, after the tests ended, so they do not disturb it)."""
    if all(spent <= LAYER_BUDGET_S[layer] for layer, spent in _spent.items()):
        return 1.0
    seconds = host_speed.reference_seconds(reps=5)
    factor = host_speed.slowdown(seconds)
    terminalreporter.write_line(
        f"host speed: the reference took {seconds:.2f} s (budgets set at "
        f"{host_speed.REFERENCE_S:.2f} s): budgets x{factor:.2f}"
    )
    return factor


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    factor = _host_factor(terminalreporter)
    over = []
    for layer, spent in sorted(_spent.items()):
        budget = LAYER_BUDGET_S[layer] * factor
        terminalreporter.write_line(f"layer {layer}: {spent:.1f} s of {budget:.0f} s budget")
        if spent > budget:
            over.append(layer)
    if over:
        terminalreporter.write_line(f"OVER BUDGET: {', '.join(over)}", red=True)
        terminalreporter._session.exitstatus = pytest.ExitCode.TESTS_FAILED  # type: ignore[union-attr]
