"""Where am I: one frozen ClusterEnv per process, detected in an explicit order. No torch here."""

from phalanx.env.cluster_env import FIELDS, LAUNCHERS, ClusterEnv
from phalanx.env.detect import detect, is_first_process, refuse_nested_launch, reports_start_error
from phalanx.env.hostlist import expand_hostlist, expand_tasks_per_node

__all__ = [
    "FIELDS",
    "LAUNCHERS",
    "ClusterEnv",
    "detect",
    "expand_hostlist",
    "expand_tasks_per_node",
    "is_first_process",
    "refuse_nested_launch",
    "reports_start_error",
]
