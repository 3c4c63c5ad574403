"""tiny's test kit for any package: hypothesis strategies for shapes, movement chains, symbolic expressions and dtypes.

`import tiny.testing` is light; hypothesis is only needed for `tiny.testing.strategies` (imported on first use
of one of its names here).
"""
from __future__ import annotations

import importlib
from typing import Any, List

_STRATEGY_NAMES = (
  "MOVEMENT_OPS", "register_profiles", "shapes", "movement_op", "movement_chains", "op_output_shape", "apply_to_shapetracker",
  "apply_to_numpy", "numpy_is_one_view", "eval_node_numpy", "shapetracker_indices", "variables", "bindings", "symbolic_trees",
  "build_node", "eval_tree", "scalar_dtypes",
)

__all__ = list(_STRATEGY_NAMES)


def __getattr__(name: str) -> Any:
  if name in _STRATEGY_NAMES:
    return getattr(importlib.import_module("tiny.testing.strategies"), name)
  raise AttributeError(f"module 'tiny.testing' has no attribute {name!r}")


def __dir__() -> List[str]:
  return sorted(set(globals()) | set(__all__))
