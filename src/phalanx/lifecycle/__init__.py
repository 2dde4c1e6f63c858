"""Lifecycle of a run: preemption signals and requeue; the hang watchdog."""

from phalanx.lifecycle.preemption import PREEMPT_SIGNAL, PreemptionWatcher

__all__ = ["PREEMPT_SIGNAL", "PreemptionWatcher"]
