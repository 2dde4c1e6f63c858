"""What phalanx.horovod does not support fails with one line naming it and the alternative."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import phalanx.horovod as hvd
from phalanx.horovod.__main__ import check_build
from phalanx.horovod.knobs import read_knobs


def _adasum() -> None:
    hvd.allreduce(torch.ones(1), op=hvd.Adasum)


def _adasum_optimizer() -> None:
    hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)]), op=hvd.Adasum)


REFUSED: dict[str, tuple[Callable[[], Any], str]] = {
    "Adasum": (_adasum, "hvd.Average"),
    "Adasum in DistributedOptimizer": (_adasum_optimizer, "hvd.Average"),
    "process set": (lambda: hvd.add_process_set([0]), "new_group"),
    "ProcessSet": (lambda: hvd.ProcessSet([0, 1]), "new_group"),
    "process_set argument": (
        lambda: hvd.allreduce(torch.ones(1), process_set=object()),
        "new_group",
    ),
    "init(process_sets)": (lambda: hvd.init(process_sets=[object()]), "new_group"),
    "timeline": (lambda: hvd.start_timeline("/tmp/t.json"), "torch.profiler"),
    "mpi4py communicator": (lambda: hvd.init(comm=object()), "without comm"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_feature_is_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # torch's first optimizer in a process sets TORCHINDUCTOR_CACHE_DIR; set here, it is undone.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    call, alternative = REFUSED[name]
    with pytest.raises(hvd.UnsupportedError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and message.startswith("phalanx.horovod does not support")
    assert alternative in message


def test_calls_before_init_say_so() -> None:
    with pytest.raises(ValueError, match=r"call hvd.init\(\) first"):
        hvd.rank()


def test_engine_knobs_warn_once_and_fusion_threshold_is_honoured() -> None:
    warned: set[str] = set()
    environ = {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1024"}
    with pytest.warns(UserWarning, match="HOROVOD_CYCLE_TIME is set but has no effect"):
        knobs = read_knobs(environ, warned)
    assert knobs.fusion_threshold_bytes == 1024 and knobs.timeout_s is None
    read_knobs(environ, warned)  # the second time is silent (pytest fails on a new warning)


def test_check_build_names_what_is_available() -> None:
    report = check_build()
    assert "[X] Gloo" in report and "Adasum" in report and "horovodrun" in report
