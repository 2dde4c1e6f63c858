"""A 2-rank Trainer run with train.compile=true whose last step recompiles on one rank (a
shorter batch there), slowly: torch.compile traces a long Python loop in forward each time it
compiles (a constant once compiled). Prints each rank's steps and the longest compilation after
the first step, measured with torch's own compile callbacks."""

from __future__ import annotations

import time

import torch
from toy_models import SlowToCompile  # same folder: sys.path[0]

import phalanx


class CompileClock:
    """Seconds of each compilation that starts after the first optimizer step."""

    def __init__(self) -> None:
        self.steps_done, self.began, self.later = 0, 0.0, [0.0]
        handler = torch._dynamo.callback_handler
        handler.register_start_callback(self.start)
        handler.register_end_callback(self.end)

    def start(self, *_: object) -> None:
        self.began = time.monotonic()

    def end(self, *_: object) -> None:
        if self.steps_done >= 1:
            self.later.append(time.monotonic() - self.began)


class CountSteps(phalanx.Callback):
    def __init__(self, clock: CompileClock) -> None:
        self.clock = clock

    def on_step_end(self, trainer: phalanx.Trainer) -> None:
        self.clock.steps_done = trainer.state.step


def main() -> None:
    cfg = phalanx.parse_config(phalanx.TrainerConfig)
    with phalanx.distributed(cfg) as d:
        gen = torch.Generator().manual_seed(0)
        count = 92  # batch 8 x 2 ranks: 5 full steps, then one of 12 samples (8 and 4)
        data = torch.utils.data.TensorDataset(
            torch.randn(count, 16, generator=gen), torch.randint(0, 4, (count,), generator=gen)
        )
        torch.manual_seed(0)
        clock = CompileClock()
        trainer = phalanx.Trainer(
            d, config=cfg, model=SlowToCompile(), train_data=data,
            train_step=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1), callbacks=[CountSteps(clock)],
        )  # fmt: skip
        trainer.fit()
        print(f"rank {d.env.rank}: {trainer.state.step} steps, longest compilation after "
              f"step 1: {max(clock.later):.1f} s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
