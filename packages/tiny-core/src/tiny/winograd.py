"""Winograd F(4x4, 3x3) convolution, used by `Tensor.conv2d` when WINO=1 (as in tinygrad).

A 3x3 stride-1 convolution computes each 4x4 output tile from a 6x6 input tile. Winograd's minimal filtering (Lavin &
Gray, 2015) turns that into an elementwise product in a transformed space: with input tile d and filter g,

    Y = At [ (G g Gt) * (Bt d B) ] A

where the product is summed over input channels before the output transform. That is 36 multiplies per tile and
channel pair instead of 144. Each transform is a product with a small constant matrix, so everything stays lazy and
differentiates like any other op. The transforms are exact in real arithmetic; in float
they add a little rounding (coefficients up to 8 and 1/24), which is why this is opt-in.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union, cast

import numpy as np

from tiny.dtype import dtypes
from tiny.helpers import WINO, all_int, make_pair

if TYPE_CHECKING:
  from tiny.tensor import DTypeLike, Tensor

# evaluation points 0, 1, -1, 2, -2 and infinity; rows are output components, columns input components
WINO_G: Tuple[Tuple[float, ...], ...] = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
                                         (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
WINO_BT: Tuple[Tuple[float, ...], ...] = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
                                          (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
WINO_AT: Tuple[Tuple[float, ...], ...] = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))
TILE_OUT, TILE_IN = 4, 6  # output tile side, input tile side (TILE_OUT + kernel - 1)


def _apply_2d(t: Tensor, mat: Sequence[Sequence[float]]) -> Tensor:
  """mat @ tile @ mat.T on the last two dims of t, as one product with kron(mat, mat) over the flattened tile.

  A matmul with a small constant keeps the kernels small; unrolling the sums into constant-weighted slices instead fuses
  hundreds of loads into one kernel, which takes seconds to generate for a one-off conv."""
  from tiny.tensor import Tensor  # function-level: tiny.tensor imports this module from conv2d
  rows, cols = len(mat), len(mat[0])
  assert t.shape[-2:] == (cols, cols), (t.shape, cols)
  kron = np.kron(np.array(mat, dtype=np.float64), np.array(mat, dtype=np.float64))  # (rows*rows, cols*cols)
  k = Tensor(kron.T.astype(np.float32), device=t.device, requires_grad=False).cast(t.dtype)
  return (t.reshape(*t.shape[:-2], cols * cols) @ k).reshape(*t.shape[:-2], rows, rows)


def eligible(x: Tensor, weight: Tensor, groups: int, stride: Union[int, Tuple[int, ...]], dilation: Union[int, Tuple[int, ...]],
             padding: List[int]) -> bool:
  """Whether the Winograd path computes this conv2d: 2-D, 3x3 kernel, stride 1, dilation 1, non-negative concrete padding,
  float dtypes, concrete shapes, at least one output pixel. Everything else takes the regular path (and its error messages)."""
  if x.ndim != 4 or weight.ndim != 4 or not all_int(x.shape) or not all_int(weight.shape) or weight.shape[2:] != (3, 3):
    return False
  if not isinstance(groups, int) or groups < 1 or x.shape[1] != groups * weight.shape[1] or weight.shape[0] % groups:
    return False
  if any(s != 1 for s in make_pair(stride, 2)) or any(d != 1 for d in make_pair(dilation, 2)):
    return False
  if len(padding) != 4 or not all(isinstance(p, int) and p >= 0 for p in padding):
    return False
  if not (dtypes.is_float(x.dtype) and dtypes.is_float(weight.dtype)) or 0 in x.shape or 0 in weight.shape:
    return False
  h, w = cast(Tuple[int, int], x.shape[2:])
  return h + padding[2] + padding[3] >= 3 and w + padding[0] + padding[1] >= 3


def winograd_conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], groups: int, stride: Union[int, Tuple[int, ...]],
                    dilation: Union[int, Tuple[int, ...]], padding: Union[int, Sequence[int]], acc_dtype: Optional[DTypeLike]) -> Optional[Tensor]:
  """conv2d through Winograd F(4x4, 3x3) when WINO is set and the conv is eligible (see `eligible`); None otherwise,
  meaning the caller computes it the regular way. Arguments are those of `Tensor.conv2d`."""
  if not WINO:
    return None
  if not isinstance(padding, int) and len(padding) not in (2, 4):
    return None
  pads = x._padding_arg(padding, 2) if x.ndim == 4 else []  # pad2d order: left, right, top, bottom
  if not eligible(x, weight, groups, stride, dilation, pads):
    return None
  (bs, _, h, w), (cout, cin, _, _) = cast(Tuple[int, ...], x.shape), cast(Tuple[int, ...], weight.shape)
  rcout = cout // groups
  oy, ox = h + pads[2] + pads[3] - 2, w + pads[0] + pads[1] - 2
  ty, tx = -(-oy // TILE_OUT), -(-ox // TILE_OUT)
  # pad the bottom/right so that every tile is whole; the extra outputs are cut off at the end
  extra_y, extra_x = ty * TILE_OUT - oy, tx * TILE_OUT - ox
  xp = x.pad2d([pads[0], pads[1] + extra_x, pads[2], pads[3] + extra_y])
  tiles = xp._pool((TILE_IN, TILE_IN), TILE_OUT)  # (bs, groups*cin, ty, tx, 6, 6), overlapping by 2
  v = _apply_2d(tiles, WINO_BT).reshape(bs, groups, 1, cin, ty, tx, TILE_IN, TILE_IN)
  u = _apply_2d(weight, WINO_G).reshape(1, groups, rcout, cin, 1, 1, TILE_IN, TILE_IN)
  m = (v * u).sum(3, acc_dtype=acc_dtype)  # (bs, groups, rcout, ty, tx, 6, 6)
  y = _apply_2d(m, WINO_AT)  # (bs, groups, rcout, ty, tx, 4, 4)
  y = y.permute(0, 1, 2, 3, 5, 4, 6).reshape(bs, cout, ty * TILE_OUT, tx * TILE_OUT).shrink((None, None, (0, oy), (0, ox)))
  return y if bias is None else y.add(bias.reshape(1, -1, 1, 1))
