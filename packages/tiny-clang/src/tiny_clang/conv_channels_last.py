"""Which conv gradients the CPU renderers compute with the channels innermost (`Renderer.conv_channels_last`)."""
from __future__ import annotations

from typing import Tuple

from tiny.backend import DType, dtypes


def conv_channels_last(simd_bytes: int, channels: int, spatial: Tuple[int, ...], dtype: DType) -> bool:
  """`Renderer.conv_channels_last` for a CPU: float32 channels that fill whole vectors, when the rows do not.

  A channels-first reduce vectorizes along a row: 20 pixels are 16 + 4 lanes on AVX-512 (the 4 widened to a full
  vector of zeros), 10, 8 or 6 pixels half a vector or so. With the channels innermost each multiply-add is a full
  vector of channels times one broadcast element. One thread, batch 64, including the transposing copies:
  weight gradients 5x5 32->32 on 24² 13.5 -> 9.2 ms, 3x3 64->64 on 8² 4.1 -> 1.3 ms, 3x3 32->64 on 10² 1.45 ->
  0.99 ms (and 3x3 64->64 on 58², batch 8, whose 56-pixel rows fill 7/8 of the vectors: 18.9 -> 14.6 ms); input
  gradients 5x5 32->32 24² 15.2 -> 12.7 ms, 3x3 32->64 10² 3.2 -> 2.4 ms, 3x3 64->64 8² 2.5 -> 1.9 ms. Rows of
  whole vectors keep the channels-first layout (not measured against it)."""
  if dtype != dtypes.float32 or simd_bytes < 16 or not spatial:
    return False
  lanes = simd_bytes // dtype.itemsize
  return channels % lanes == 0 and spatial[-1] % lanes != 0
