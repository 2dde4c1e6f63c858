"""Where training stands: what a checkpoint saves and a resume hands back to the loop."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainState:
    """Where training stands; the data position does not depend on the world size."""

    step: int = 0
    """Optimizer steps done."""
    epoch: int = 0
    """Current epoch."""
    global_index: int = 0
    """Samples of this epoch's global order already consumed (all ranks together)."""
