"""Lifecycle of a run: preemption signals, requeue (later: hang watchdog, fail-fast)."""

from phalanx.lifecycle.preemption import PREEMPT_SIGNAL, PreemptionWatcher

__all__ = ["PREEMPT_SIGNAL", "PreemptionWatcher"]
