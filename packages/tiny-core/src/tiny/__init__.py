"""tiny: lazy tensors, kernel fusion and a small compiler, with every accelerator in a plugin package.

``import tiny`` stays light: the public names below are imported on first access, and plugins are
discovered on first use of ``Device``, never here.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

__version__ = "0.1.0"

if TYPE_CHECKING:
  from tiny.dtype import dtypes
  from tiny.engine.jit import TinyJit
  from tiny.helpers import Context, GlobalCounters, getenv
  from tiny.registry import Device
  from tiny.shape.symbolic import Variable
  from tiny.tensor import Tensor

_LAZY: Dict[str, str] = {
  "Tensor": "tiny.tensor", "TinyJit": "tiny.engine.jit", "Device": "tiny.registry", "dtypes": "tiny.dtype",
  "Variable": "tiny.shape.symbolic", "Context": "tiny.helpers", "GlobalCounters": "tiny.helpers", "getenv": "tiny.helpers",
}

__all__ = ["Tensor", "TinyJit", "Device", "dtypes", "Variable", "Context", "GlobalCounters", "getenv"]


def __getattr__(name: str) -> Any:
  if name not in _LAZY:
    raise AttributeError(f"module 'tiny' has no attribute {name!r}")
  value = getattr(importlib.import_module(_LAZY[name]), name)
  globals()[name] = value   # later lookups skip __getattr__
  return value


def __dir__() -> List[str]:
  return sorted(set(globals()) | set(__all__))
