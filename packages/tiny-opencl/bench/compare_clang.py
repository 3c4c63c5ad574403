"""GPU (OpenCL) against CLANG in one process: matmul, softmax and conv2d, best of N runs after a warm-up.

  python packages/tiny-opencl/bench/compare_clang.py [--runs 10]

Each run realizes a fresh lazy graph (so it schedules, but compiles nothing new: the kernels are cached after the warm-up)
and waits for the device; the time is the host's wall clock around realize + synchronize.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

from tiny import Device, Tensor


def cases() -> List[Tuple[str, float, Callable[[Dict[str, Tensor]], Tensor], Dict[str, Tuple[int, ...]]]]:
  """(name, flops, fn(inputs) -> output, input shapes)."""
  return [
    ("matmul 512x512 @ 512x512", 2 * 512 ** 3, lambda t: t["a"] @ t["b"], {"a": (512, 512), "b": (512, 512)}),
    ("softmax 1024x1024 (last axis)", 5 * 1024 * 1024, lambda t: t["a"].softmax(-1), {"a": (1024, 1024)}),
    ("conv2d 1x32x64x64, 32 3x3 filters, pad 1", 2 * 32 * 32 * 9 * 64 * 64, lambda t: t["x"].conv2d(t["w"], padding=1),
     {"x": (1, 32, 64, 64), "w": (32, 32, 3, 3)}),
  ]


def bench(device: str, fn: Callable[[Dict[str, Tensor]], Tensor], shapes: Dict[str, Tuple[int, ...]], runs: int) -> Tuple[float, np.ndarray]:
  """Best seconds of `runs` timed runs on device, and the result."""
  rng = np.random.default_rng(0)
  inputs = {k: Tensor(rng.standard_normal(s).astype(np.float32), device=device).realize() for k, s in shapes.items()}
  out = fn(inputs).realize()   # warm-up: compiles every kernel
  Device[device].synchronize()
  best = float("inf")
  for _ in range(runs):
    st = time.perf_counter()
    fn(inputs).realize()
    Device[device].synchronize()
    best = min(best, time.perf_counter() - st)
  return best, out.numpy()


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--runs", type=int, default=10)
  ap.add_argument("--devices", default="GPU,CLANG")
  args = ap.parse_args()
  devices = args.devices.split(",")
  print("| case | " + " | ".join(f"{d} ms (GFLOP/s)" for d in devices) + " | max abs diff |")
  print("|---|" + "---|" * (len(devices) + 1))
  for name, flops, fn, shapes in cases():
    row, outs = [], []
    for d in devices:
      secs, out = bench(d, fn, shapes, args.runs)
      row.append(f"{secs * 1e3:.2f} ({flops / secs * 1e-9:.1f})")
      outs.append(out)
    diff = max(float(np.abs(o - outs[0]).max()) for o in outs)
    print(f"| {name} | " + " | ".join(row) + f" | {diff:.1e} |")


if __name__ == "__main__":
  main()
