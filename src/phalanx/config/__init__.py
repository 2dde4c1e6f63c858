"""Typed, keyword-only config dataclasses; YAML file + dotted CLI overrides; one-line errors.

Why not a library: OmegaConf/Hydra resolve per process (every rank makes its own output folder)
and print multi-line errors; pydantic and tyro cost more import time than `phalanx --help` may
spend. Frozen dataclasses + PyYAML give typed access, `__post_init__` validation and docstring
help in ~300 lines (see docs/config.md).
"""

from phalanx.config.loader import dump, load, read_yaml
from phalanx.config.schema import Config, DistConfig, RunConfig

__all__ = ["Config", "DistConfig", "RunConfig", "dump", "load", "read_yaml"]
