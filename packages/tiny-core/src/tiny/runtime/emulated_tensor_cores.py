"""Tensor cores the PYTHON device can emulate for devices whose packages have no renderer yet.

Used only by the PYTHON device's emulate mode (``EMULATE_<DEVICE>=1`` or ``PythonRenderer(emulate=...)``), and only when
the emulated device's own renderer cannot be asked: a device that has a renderer declares its tensor cores there (CUDA's
are in tiny-cuda), and the emulator takes them from it through the registry. tiny-amd and tiny-metal are stubs without a
renderer so far, so their definitions wait here; they move into those packages with their renderers.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from tiny.dtype import DType, dtypes
from tiny.renderer import RegisterLayout, TensorCore


def _pairs(*names: Tuple[str, str]) -> List[Tuple[DType, DType]]:
  return [(getattr(dtypes, i), getattr(dtypes, o)) for i, o in names]


# RDNA3 WMMA, wave32: lane L holds row L%16 of A and column L%16 of B (both half-waves the same); D element e of lane L
# is row 2e + L//16, column L%16
_RDNA3 = (RegisterLayout(16, rows=(("lane", 1, 16, 1),), cols=(("reg", 1, 0, 1),)),
          RegisterLayout(16, rows=(("reg", 1, 0, 1),), cols=(("lane", 1, 16, 1),)),
          RegisterLayout(8, rows=(("reg", 1, 0, 2), ("lane", 16, 0, 1)), cols=(("lane", 1, 16, 1),)))

# simdgroup_matrix 8x8: the same layout for A, B and C; lanes walk quad rows, lane pairs hold two adjacent columns
_SIMDGROUP = RegisterLayout(2, rows=(("lane", 2, 4, 1), ("lane", 16, 0, 4)), cols=(("reg", 1, 0, 1), ("lane", 1, 2, 2), ("lane", 8, 2, 4)))


def amd_tensor_cores() -> List[TensorCore]:
  """RDNA3 WMMA 16x16x16 in wave32: half in, float or half out."""
  return [TensorCore(dims=(16, 16, 16), threads=[(0, 8), (0, 2), (1, 2)], thread_local_sizes=[[16], [16], [4, 2]], dtype_in=di, dtype_out=do,
                     layout=_RDNA3) for di, do in _pairs(("half", "float"), ("half", "half"))]


def metal_tensor_cores() -> List[TensorCore]:
  """simdgroup_matrix 8x8x8 on a 32-thread simdgroup."""
  return [TensorCore(dims=(8, 8, 8), threads=[(0, 2), (1, 4), (0, 2), (1, 2)], thread_local_sizes=[[2], [2], [2]], dtype_in=di, dtype_out=do,
                     layout=(_SIMDGROUP,) * 3) for di, do in _pairs(("float", "float"), ("half", "float"), ("half", "half"))]


# device name -> its tensor cores, for devices the emulator cannot ask for a renderer
WITHOUT_RENDERER: Dict[str, Callable[[], List[TensorCore]]] = {"AMD": amd_tensor_cores, "METAL": metal_tensor_cores}
