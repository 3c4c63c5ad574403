"""Per-kernel profile of the jitted MNIST CNN training step (bench/models/mnist_cnn.py) on CLANG or LLVM.

`THREADS=1 CLANG=1 python bench/mnist_kernels.py [--batch 64] [--top 15] [--runs 7]`

Builds the step, lets TinyJit capture it, then times every captured kernel alone on its own buffers: the best of
`--runs` runs, in CPU time of the calling thread (THREADS=1), which a busy shared machine disturbs far less than wall
time. Prints each kernel's share of the total and its GFLOP/s and GB/s from the kernel's own estimates (which count
the lanes a vector op computes, padding included).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Any, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def captured_kernels(run: Any) -> List[Any]:
  """The ExecItems a `tensor_step` closure's TinyJit captured (a graph's items one by one)."""
  step = dict(zip(run.__code__.co_freevars, [c.cell_contents for c in run.__closure__ or ()]))["step"]
  items: List[Any] = []
  for ji in step.jit_cache:
    items += getattr(ji.prg, "jit_cache", None) or [ji]
  return items


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--top", type=int, default=15)
  ap.add_argument("--runs", type=int, default=7)
  args = ap.parse_args()
  from models.mnist_cnn import tensor_step
  run = tensor_step("tiny", args.batch)
  for _ in range(3):
    run().numpy()
  items = captured_kernels(run)
  run().numpy()   # a replay puts the step's own input buffers back into the captured items
  rows = []
  for ei in items:
    bufs = list(ei.bufs)
    best = min(_thread_time(lambda: ei.prg(bufs, {}, wait=True)) for _ in range(args.runs))
    rows.append((best, re.sub("\x1b\\[[0-9;]*m", "", ei.prg.display_name), float(ei.prg.op_estimate), float(ei.prg.mem_estimate)))
  total = sum(r[0] for r in rows)
  print(f"{len(rows)} kernels, {total * 1e3:.2f} ms in all (best of {args.runs}, thread CPU time)")
  print(f"{'ms':>8} {'share':>6} {'GFLOP/s':>8} {'GB/s':>6}  kernel")
  for t, name, ops, mem in sorted(rows, key=lambda r: -r[0])[:args.top]:
    print(f"{t * 1e3:8.3f} {100 * t / total:5.1f}% {ops / t / 1e9 if t else 0:8.1f} {mem / t / 1e9 if t else 0:6.1f}  {name}")


def _thread_time(fn: Any) -> float:
  st = time.thread_time()
  fn()
  return time.thread_time() - st


if __name__ == "__main__":
  main()
