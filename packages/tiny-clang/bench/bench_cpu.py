#!/usr/bin/env python3
"""CPU benchmark of the CLANG and LLVM devices against numpy (and torch when installed), in one run.

  python packages/tiny-clang/bench/bench_cpu.py [--devices CLANG,LLVM] [--quick] [--threads N] [--beam N]

Reports compile latency per kernel, matmul 1024^2 and 2048^2 GFLOP/s, fused elementwise and sum-reduction GB/s and conv2d
GFLOP/s. Each figure is the median of several timed runs after a warm-up; tiny runs through TinyJit (steady state, as in a
training step). The reference libraries use all cores they normally use (numpy's BLAS and torch are multi-threaded).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np


def timeit(fn: Callable[[], Any], reps: int) -> float:
  """Median wall time of fn() in seconds over reps runs, after one warm-up run."""
  fn()
  times = []
  for _ in range(reps):
    st = time.perf_counter()
    fn()
    times.append(time.perf_counter() - st)
  return statistics.median(times)


def tiny_fn(dev: str, make: Callable[[], Any]) -> Callable[[], Any]:
  """A jitted tiny computation: make() builds and realizes the output Tensor."""
  from tiny.engine.jit import TinyJit
  jf = TinyJit(make)

  def run() -> None:
    jf()
  return run


def compile_latency(dev: str, n: int = 8) -> Tuple[float, float]:
  """(ms to render one kernel from its AST, ms to compile and load it) averaged over n distinct kernels."""
  from tiny.codegen.kernel import Kernel
  from tiny.registry import Device
  from tiny.tensor import Tensor
  d = Device[dev]
  asts = []
  for i in range(n):
    a = Tensor.empty(64, 64, device=dev)
    out = ((a * (1.5 + i)).exp2() + a.sum(1, keepdim=True)).relu()
    asts += [si.ast for si in out.schedule() if si.ast.op.name == "KERNEL"]
  render_t, compile_t = [], []
  for i, ast in enumerate(asts):
    st = time.perf_counter()
    k = Kernel(ast, opts=d.renderer)
    k.hand_coded_optimizations()
    prg = k.to_program(name_override=f"bench_{i}_{os.getpid()}")
    render_t.append(time.perf_counter() - st)
    st = time.perf_counter()
    lib = d.compiler.compile(prg.src)
    d.runtime(prg.name, lib)
    compile_t.append(time.perf_counter() - st)
  return statistics.median(render_t) * 1e3, statistics.median(compile_t) * 1e3


def bench_device(dev: str, sizes: Dict[str, Any], reps: int) -> Dict[str, float]:
  from tiny.tensor import Tensor
  res: Dict[str, float] = {}
  rng = np.random.default_rng(0)
  res["render_ms"], res["compile_ms"] = compile_latency(dev)
  for n in sizes["matmul"]:
    a = Tensor(rng.standard_normal((n, n), dtype=np.float32), device=dev).realize()
    b = Tensor(rng.standard_normal((n, n), dtype=np.float32), device=dev).realize()
    t = timeit(tiny_fn(dev, lambda: (a @ b).realize()), reps)
    res[f"matmul{n}"] = 2 * n ** 3 / t / 1e9
  n = sizes["elementwise"]
  x, y, z = [Tensor(rng.standard_normal(n, dtype=np.float32), device=dev).realize() for _ in range(3)]
  res["elementwise"] = 16 * n / timeit(tiny_fn(dev, lambda: (x * y + z).relu().realize()), reps) / 1e9
  res["sum"] = 4 * n / timeit(tiny_fn(dev, lambda: x.sum().realize()), reps) / 1e9
  B, C, H, W, O = sizes["conv"]
  img = Tensor(rng.standard_normal((B, C, H, W), dtype=np.float32), device=dev).realize()
  w = Tensor(rng.standard_normal((O, C, 3, 3), dtype=np.float32), device=dev).realize()
  res["conv2d"] = 2 * B * O * H * W * C * 9 / timeit(tiny_fn(dev, lambda: img.conv2d(w, padding=1).realize()), reps) / 1e9
  return res


def bench_numpy(sizes: Dict[str, Any], reps: int) -> Dict[str, float]:
  res: Dict[str, float] = {}
  rng = np.random.default_rng(0)
  for n in sizes["matmul"]:
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    res[f"matmul{n}"] = 2 * n ** 3 / timeit(lambda: a @ b, reps) / 1e9
  n = sizes["elementwise"]
  x, y, z = [rng.standard_normal(n, dtype=np.float32) for _ in range(3)]
  res["elementwise"] = 16 * n / timeit(lambda: np.maximum(x * y + z, 0), reps) / 1e9
  res["sum"] = 4 * n / timeit(lambda: x.sum(), reps) / 1e9
  B, C, H, W, O = sizes["conv"]
  img, w = rng.standard_normal((B, C, H, W), dtype=np.float32), rng.standard_normal((O, C, 3, 3), dtype=np.float32)

  def conv() -> Any:
    # im2col with a strided view, then one BLAS call: the usual way to convolve with numpy
    p = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.lib.stride_tricks.sliding_window_view(p, (3, 3), axis=(2, 3))  # B, C, H, W, 3, 3
    return np.tensordot(cols, w, axes=([1, 4, 5], [1, 2, 3]))
  res["conv2d"] = 2 * B * O * H * W * C * 9 / timeit(conv, reps) / 1e9
  return res


def bench_torch(sizes: Dict[str, Any], reps: int) -> Optional[Dict[str, float]]:
  try:
    import torch
  except ImportError:
    return None
  res: Dict[str, float] = {}
  g = torch.Generator().manual_seed(0)
  with torch.no_grad():
    for n in sizes["matmul"]:
      a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
      res[f"matmul{n}"] = 2 * n ** 3 / timeit(lambda: a @ b, reps) / 1e9
    n = sizes["elementwise"]
    x, y, z = torch.randn(n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)
    res["elementwise"] = 16 * n / timeit(lambda: torch.relu(x * y + z), reps) / 1e9
    res["sum"] = 4 * n / timeit(lambda: x.sum(), reps) / 1e9
    B, C, H, W, O = sizes["conv"]
    img, w = torch.randn(B, C, H, W, generator=g), torch.randn(O, C, 3, 3, generator=g)
    res["conv2d"] = 2 * B * O * H * W * C * 9 / timeit(lambda: torch.nn.functional.conv2d(img, w, padding=1), reps) / 1e9
  return res


def rows(sizes: Dict[str, Any]) -> List[Tuple[str, str]]:
  B, C, H, W, O = sizes["conv"]
  return [("compile_ms", "compile + load, ms/kernel"), ("render_ms", "codegen (AST -> source), ms/kernel")] + \
    [(f"matmul{n}", f"matmul {n}x{n}, GFLOP/s") for n in sizes["matmul"]] + \
    [("elementwise", f"relu(x*y+z) of {sizes['elementwise']} floats, GB/s"), ("sum", f"sum of {sizes['elementwise']} floats, GB/s"),
     ("conv2d", f"conv2d {B}x{C}x{H}x{W} * {O}x{C}x3x3, GFLOP/s")]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--devices", default="CLANG,LLVM")
  ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
  ap.add_argument("--threads", type=int, default=None, help="THREADS for tiny (default: auto, every core)")
  ap.add_argument("--beam", type=int, default=0, help="BEAM width for tiny's kernel search (0: heuristic opts)")
  ap.add_argument("--reps", type=int, default=5)
  args = ap.parse_args()
  if args.threads is not None:
    os.environ["THREADS"] = str(args.threads)
  if args.beam:
    os.environ["BEAM"] = str(args.beam)
  sizes = {"matmul": [256] if args.quick else [1024, 2048], "elementwise": 1 << (18 if args.quick else 24),
           "conv": (1, 8, 16, 16, 8) if args.quick else (8, 64, 56, 56, 64)}
  cols: List[Tuple[str, Dict[str, float]]] = []
  for dev in args.devices.split(","):
    print(f"benchmarking {dev} ...", file=sys.stderr, flush=True)
    cols.append((dev, bench_device(dev, sizes, args.reps)))
  print("benchmarking numpy ...", file=sys.stderr, flush=True)
  cols.append((f"numpy {np.__version__}", bench_numpy(sizes, args.reps)))
  if (tr := bench_torch(sizes, args.reps)) is not None:
    import torch
    cols.append((f"torch {torch.__version__}", tr))
  keys = [(k, label) for k, label in rows(sizes) if any(k in c for _, c in cols)]
  print(f"\ncpu: {os.cpu_count()} cores, THREADS={os.environ.get('THREADS', 'auto')}, BEAM={os.environ.get('BEAM', '0')}\n")
  print("| " + " | ".join(["metric"] + [name for name, _ in cols]) + " |")
  print("|" + "---|" * (len(cols) + 1))
  for k, label in keys:
    print("| " + " | ".join([label] + [f"{c[k]:.2f}" if k in c else "–" for _, c in cols]) + " |")
  np_col = cols[[n for n, _ in cols].index(f"numpy {np.__version__}")][1]
  print("\nshare of numpy:")
  for name, c in cols[:len(args.devices.split(","))]:
    print(f"  {name}: " + ", ".join(f"{k} {c[k] / np_col[k] * 100:.0f}%" for k, _ in keys if k in c and k in np_col and "ms" not in k))


if __name__ == "__main__":
  main()
