"""Where am I: one frozen ClusterEnv per process, detected in an explicit order. No torch here."""

from phalanx.env.cluster_env import FIELDS, ClusterEnv
from phalanx.env.detect import detect, is_first_process, refuse_nested_launch
from phalanx.env.hostlist import expand_hostlist, expand_tasks_per_node
from phalanx.env.launchers import LAUNCHERS
from phalanx.env.start_error import prints_start_error, report_start_error

__all__ = [
    "FIELDS",
    "LAUNCHERS",
    "ClusterEnv",
    "detect",
    "expand_hostlist",
    "expand_tasks_per_node",
    "is_first_process",
    "prints_start_error",
    "refuse_nested_launch",
    "report_start_error",
]
