"""strategy=auto on several ranks runs DDP; when that runs out of GPU memory, one line names the
fix (FSDP). The GPU error itself is built here: the logic needs no GPU."""

from __future__ import annotations

import pytest
import torch

from phalanx.errors import UsageError
from phalanx.train.strategy import ddp_oom_message, explain_ddp_oom

pytestmark = pytest.mark.pure
OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def test_the_hint_names_fsdp_only_when_auto_chose_ddp() -> None:
    message = ddp_oom_message(OOM, requested="auto", world_size=2)
    assert message is not None and "\n" not in message
    assert message.startswith("DDP ran out of GPU memory (train.strategy=auto chose ddp")
    assert message.endswith(
        "set train.strategy=fsdp checkpoint.sharded=true to shard them over the ranks"
    )
    assert ddp_oom_message(OOM, requested="ddp", world_size=2) is None  # the user's choice
    assert ddp_oom_message(OOM, requested="auto", world_size=1) is None  # single device
    assert ddp_oom_message(RuntimeError("boom"), requested="auto", world_size=2) is None


def test_an_oom_inside_becomes_the_one_line_usage_error_with_the_oom_as_cause() -> None:
    expected = pytest.raises(UsageError, match=r"^DDP ran out of GPU memory")
    with expected as caught, explain_ddp_oom("auto", 2):
        raise OOM
    assert caught.value.__cause__ is OOM
    with pytest.raises(torch.OutOfMemoryError), explain_ddp_oom("fsdp", 2):
        raise OOM
