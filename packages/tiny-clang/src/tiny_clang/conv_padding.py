"""Which conv inputs the CPU renderers ask `Tensor.conv2d` to copy into a zero-padded buffer (`Renderer.pads_conv_input`)."""
from __future__ import annotations

from typing import Tuple

from tiny.backend import DType, dtypes


def pads_conv_input(simd_bytes: int, padded_spatial: Tuple[int, ...], dtype: DType) -> bool:
  """`Renderer.pads_conv_input` for a CPU: copy a float image whose padded rows are at least 4 vectors wide (3 on AVX-512).

  Through a padded view each vector load of a row checks its lanes and, at an edge, gathers lane by lane; clang then
  spills accumulators around the fallback. One copy into a zero-padded buffer makes every load a plain vector load, and
  large unpadded images also get the two-row conv tile (b32 64->64 3x3 on 56², one AVX2 thread: 222-234 ms through the
  view, 122-135 ms with the copy). Small images (MNIST's) keep the view: their whole-row tiles were tuned on it."""
  if dtype not in (dtypes.float32, dtypes.float64, dtypes.float16) or simd_bytes < 16 or not padded_spatial:
    return False
  lanes = simd_bytes // dtype.itemsize
  # (AVX-512: 16 float lanes) from 3 vectors up: 56² images padded to 58 get the whole-row tile of
  # tiny_clang.heuristics.output_strip, which needs plain loads; MNIST's 32- and 16-wide padded rows stay below
  return padded_spatial[-1] >= (3 if simd_bytes >= 64 else 4) * lanes
