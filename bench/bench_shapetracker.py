"""Movement ops per second of a typical reshape-permute-pad chain on a ShapeTracker (the scheduler's hot path).

Run `python bench/bench_shapetracker.py`; it prints the figure for the cached path (the same chain again, as
when a model builds the same graph every step) and for fresh shapes (every View built anew).
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Tuple

from tiny.shape.shapetracker import ShapeTracker

OPS_PER_CHAIN = 8


def chain(b: int, c: int, h: int, w: int) -> ShapeTracker:
  """An NCHW conv-ish input pipeline: pad, window reshape, permute, expand, reshape, shrink, then the index expression."""
  st = ShapeTracker.from_shape((b, c, h, w))
  st = st.pad(((0, 0), (0, 0), (1, 1), (1, 1)))
  st = st.reshape((b, c, (h + 2) * (w + 2)))
  st = st.permute((0, 2, 1))
  st = st.reshape((b, (h + 2), (w + 2), 1, c))
  st = st.expand((b, h + 2, w + 2, 4, c))
  st = st.permute((0, 3, 1, 2, 4))
  st = st.shrink(((0, b), (0, 4), (1, h + 1), (1, w + 1), (0, c)))
  st = st.reshape((b * 4, h * w, c))
  return st


def measure(fn: Callable[[int], object], seconds: float) -> Tuple[float, int]:
  n, start = 0, time.perf_counter()
  while (elapsed := time.perf_counter() - start) < seconds:
    fn(n)
    n += 1
  return n * OPS_PER_CHAIN / elapsed, n


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
  args = parser.parse_args()
  cached, n1 = measure(lambda i: chain(4, 16, 32, 32), args.seconds)
  fresh, n2 = measure(lambda i: chain(4, 16 + i, 32, 32), args.seconds)
  with_expr, n3 = measure(lambda i: chain(4, 16 + i, 32, 32).expr_idxs(), args.seconds)
  print(f"shapetracker movement ops/s, cached views:       {cached:12,.0f}  ({n1} chains of {OPS_PER_CHAIN} ops)")
  print(f"shapetracker movement ops/s, fresh views:        {fresh:12,.0f}  ({n2} chains)")
  print(f"shapetracker movement ops/s, fresh + expr_idxs:  {with_expr:12,.0f}  ({n3} chains)")


if __name__ == "__main__":
  main()
