"""The GPU benchmarks' scripts run end to end on CPUs (tiny sizes, gloo), so that a device
session's minutes are not spent finding a broken argument or a changed API (issue #17: the
one-process comparisons are `step_pairs.py` and `step_profile.py`). Nothing here is timed."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from tests.support.procs import VENV_BIN, run

pytestmark = pytest.mark.dist

BENCH = Path(__file__).parents[2] / "benchmarks"


@pytest.mark.timeout(150)
def test_step_pairs_alternates_windows_on_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "pairs.json"
    cmd = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2",
           str(BENCH / "step_pairs.py"), "--size", "tiny", "--pairs", "7", "--window", "2",
           "--warmup", "1", "--clip", "1.0", "--out", str(out), "data.num_workers=0"]  # fmt: skip
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["world"] == 2
    assert len(record["hand_ms"]) == len(record["trainer_ms"]) == 7
    assert min(record["hand_ms"] + record["trainer_ms"]) > 0
    hand, ours = record["hand_ms"], record["trainer_ms"]
    assert record["hand_median"] == pytest.approx(statistics.median(hand))
    medians = statistics.median(ours) / statistics.median(hand)
    assert record["overhead"] == pytest.approx(medians - 1)
    # The pairs' ratios come from the windows as recorded, in order: pair i is (ours[i], hand[i]).
    paired = statistics.median(o / h - 1 for o, h in zip(ours, hand, strict=True))
    assert record["paired"] == pytest.approx(paired)
    assert "median of the pairs' ratios" in result.stdout


@pytest.mark.timeout(150)
def test_step_pairs_control_times_the_hand_loop_against_itself(tmp_path: Path) -> None:
    out = tmp_path / "control.json"
    cmd = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=2",
           str(BENCH / "step_pairs.py"), "--size", "tiny", "--pairs", "7", "--window", "2",
           "--warmup", "1", "--control", "--switch-interval", "0.01",
           "--out", str(out)]  # fmt: skip
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["args"]["control"] is True and record["args"]["switch_interval"] == 0.01
    assert len(record["hand_ms"]) == len(record["trainer_ms"]) == 7
    assert min(record["hand_ms"] + record["trainer_ms"]) > 0
    assert "hand (2nd)" in result.stdout and "A/A control, no goal" in result.stdout
    assert "trainer" not in result.stdout  # no Trainer's windows were reported


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train.max_steps=5"], "train.max_steps=5: set from --warmup, --pairs and --window; "
         "leave it out"),
        (["--control", "data.num_workers=0"], "--control runs no Trainer: leave out train.x=y "
         "overrides and --sharing"),
        (["--switch-interval", "0"], "--switch-interval 0.0: give seconds above 0"),
    ],
)  # fmt: skip
def test_step_pairs_refuses_what_it_cannot_do(args: list[str], message: str) -> None:
    cmd = [sys.executable, str(BENCH / "step_pairs.py"), "--size", "tiny", *args]
    result = run(cmd, timeout=45)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(message)


@pytest.mark.timeout(150)
def test_step_profile_times_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(BENCH / "step_profile.py"), "--nproc", "1", "--size", "tiny",
           "--reps", "1", "--warmup", "2", "--window", "3", "--out", str(out)]  # fmt: skip
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    for side in ("hand", "trainer"):
        (rep,) = record["timing"][side]
        assert rep["step_ms"] > 0 and rep["model_ms"] > 0, rep
    assert "per step" in result.stdout


@pytest.mark.timeout(150)
def test_fetch_before_backward_probe_runs_with_loader_workers(tmp_path: Path) -> None:
    out = tmp_path / "early.json"
    cmd = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc_per_node=1",
           str(BENCH / "probes" / "fetch_before_backward.py"), "--early", "--size", "tiny",
           "--pairs", "7", "--window", "2", "--warmup", "1", "--out", str(out),
           "data.num_workers=1"]  # fmt: skip
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(json.loads(out.read_text())["trainer_ms"]) == 7
    assert "voluntary" in result.stdout  # the scheduling table of both sides


# Trains the same model twice in one fresh process, the second time with the probe's patch:
# a loader worker, 2 epochs (a new feed each), grad_accum=2, a data set the batches do not
# divide (a short last batch). Prints whether the weights are equal and how often the patched
# feed took a step's batches before a backward.
_SAME_BATCHES = """
import json, sys, torch, phalanx
from phalanx.config import load
sys.path.insert(0, sys.argv[1])
data = torch.utils.data.TensorDataset(torch.randn(44, 4), torch.randn(44, 1))
def step(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)
def train():
    cfg = load(phalanx.TrainerConfig, overrides=["train.epochs=2", "data.batch_size=8",
        "train.progress=false", "data.num_workers=1", "train.grad_accum=2", "track.trackers=[]"])
    with phalanx.distributed(cfg.dist) as d:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        trainer = phalanx.Trainer(d, config=cfg, model=model, train_data=data, train_step=step,
                                  optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
        trainer.fit()
        return model.weight.detach().clone(), trainer.state.step
if __name__ == "__main__":
    plain, plain_steps = train()
    import fetch_before_backward
    feed_class = fetch_before_backward.ask_before_backward()
    made = []
    init = feed_class.__init__
    def counted(self, *args):
        init(self, *args)
        made.append(self)
    feed_class.__init__ = counted
    early, steps = train()
    print(json.dumps({"equal": torch.equal(plain, early), "steps": [plain_steps, steps],
                      "early": [f.early for f in made]}))
"""


@pytest.mark.timeout(150)
def test_fetch_before_backward_keeps_the_batches_and_their_order(tmp_path: Path) -> None:
    script = tmp_path / "same_batches.py"
    script.write_text(_SAME_BATCHES)
    result = run([sys.executable, str(script), str(BENCH / "probes")], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["equal"], record
    plain_steps, steps = record["steps"]
    assert steps == plain_steps > 2
    # One feed an epoch; every step's first backward took the next step's batches.
    assert len(record["early"]) == 2 and sum(record["early"]) == steps, record


# A stand-in for peer_step.py (CI has no ../shared): the names mfu_settings.py reads from it.
_REFERENCE = """
import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, V, L, H, D = 2, 16, 64, 1, 2, 16


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.qkv = nn.Embedding(V, D), nn.Linear(D, 3 * D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        q, k, v = self.qkv(self.tok(idx)).split(D, dim=2)
        q, k, v = (z.view(b, t, H, D // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        return F.cross_entropy(self.head(y.reshape(b, t, D)).view(-1, V), targets.view(-1))
"""


@pytest.mark.timeout(150)
def test_mfu_settings_compiles_each_attention_setting_anew(tmp_path: Path) -> None:
    ref, out = tmp_path / "reference.py", tmp_path / "mfu.json"
    ref.write_text(_REFERENCE)
    cmd = [sys.executable, str(BENCH / "probes" / "mfu_settings.py"), "--ref", str(ref),
           "--settings", "default,cudnn", "--rounds", "2", "--window", "1",
           "--out", str(out)]  # fmt: skip
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["settings"]
    assert all(len(rows[s]["times_ms"]) == 2 for s in ("default", "cudnn"))
    # Dynamo compiled the `cudnn` setting's own graph: session 21's GPU run, with the backend
    # chosen around the call, ran the default's compiled code instead (0 graphs).
    assert rows["default"]["graphs_compiled"] >= 1 and rows["cudnn"]["graphs_compiled"] >= 1, rows
