"""Benchmark tiny against numpy, torch (CPU) and tinygrad in one process.

Run `python bench/run.py` (or `nox -s bench`). Each benchmark runs after warm-up; we report the median
of several timed runs, the throughput, and the ratio tiny/peer (above 1 means tiny is faster).
Results go to stdout as a markdown table, to `bench/RESULTS.md` with `--write`, and as JSON lines to
`--json FILE`.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

Runner = Callable[[], Any]


@dataclass
class Result:
  """One (benchmark, framework, device) measurement."""

  bench: str
  framework: str
  device: str
  median_s: float
  unit: str
  value: float
  peak_mem_mb: Optional[float] = None
  note: str = ""
  extra: Dict[str, Any] = field(default_factory=dict)


def time_it(fn: Runner, sync: Callable[[], None], warmup: int, repeat: int, budget_s: float) -> float:
  """Median wall time of fn() after warm-up; stops early when the time budget is used up."""
  for _ in range(warmup):
    fn()
    sync()
  times: List[float] = []
  start = time.perf_counter()
  for _ in range(repeat):
    st = time.perf_counter()
    fn()
    sync()
    times.append(time.perf_counter() - st)
    if time.perf_counter() - start > budget_s and len(times) >= 3:
      break
  return statistics.median(times)


# ---------------------------------------------------------------- frameworks

class Framework:
  """Adapter that builds the workloads for one framework and device."""

  name = ""
  device = "CPU"

  def sync(self) -> None:
    pass

  def peak_mem_mb(self) -> Optional[float]:
    return None


class NumpyFW(Framework):
  name = "numpy"

  def matmul(self, n: int) -> Runner:
    a, b = np.random.rand(n, n).astype(np.float32), np.random.rand(n, n).astype(np.float32)
    return lambda: a @ b

  def elementwise(self, n: int) -> Runner:
    a, b, c = (np.random.rand(n).astype(np.float32) for _ in range(3))
    out = np.empty_like(a)

    def run() -> Any:
      np.multiply(a, b, out=out)
      np.add(out, c, out=out)
      return np.maximum(out, 0, out=out)
    return run

  def reduce_sum(self, n: int) -> Runner:
    a = np.random.rand(n).astype(np.float32)
    return lambda: a.sum()

  def softmax(self, n: int) -> Runner:
    a = np.random.rand(n, n).astype(np.float32)

    def run() -> Any:
      e = np.exp(a - a.max(axis=-1, keepdims=True))
      return e / e.sum(axis=-1, keepdims=True)
    return run


class TorchFW(Framework):
  name = "torch"

  def __init__(self) -> None:
    import torch
    self.torch = torch
    torch.manual_seed(0)

  def matmul(self, n: int) -> Runner:
    a, b = self.torch.rand(n, n), self.torch.rand(n, n)
    return lambda: a @ b

  def elementwise(self, n: int) -> Runner:
    a, b, c = (self.torch.rand(n) for _ in range(3))
    return lambda: (a * b + c).relu()

  def reduce_sum(self, n: int) -> Runner:
    a = self.torch.rand(n)
    return lambda: a.sum()

  def softmax(self, n: int) -> Runner:
    a = self.torch.rand(n, n)
    return lambda: a.softmax(-1)

  def conv2d(self, bs: int, cin: int, cout: int, hw: int, k: int) -> Runner:
    x, w = self.torch.rand(bs, cin, hw, hw), self.torch.rand(cout, cin, k, k)
    return lambda: self.torch.nn.functional.conv2d(x, w, padding=1)

  def overhead(self, n_ops: int) -> Runner:
    x = self.torch.rand(16)

    def run() -> Any:
      y = x
      for _ in range(n_ops):
        y = y * 1.0001 + 0.0001
      return y.sum().item()
    return run


class TinyLikeFW(Framework):
  """tiny and tinygrad share the Tensor API, so one adapter serves both."""

  def __init__(self, module: str, device: str) -> None:
    self.mod = importlib.import_module(module)
    self.name, self.device = module, device
    self.Tensor = self.mod.Tensor
    self.Device = importlib.import_module(f"{module}.device").Device
    self.GlobalCounters = importlib.import_module(f"{module}.helpers").GlobalCounters
    self.Tensor.manual_seed(0)

  def sync(self) -> None:
    self.Device[self.device].synchronize()

  def peak_mem_mb(self) -> Optional[float]:
    peak = getattr(self.GlobalCounters, "mem_peak", None) or getattr(self.GlobalCounters, "mem_used", None)
    return None if peak is None else peak / 1e6

  def _rand(self, *shape: int) -> Any:
    return self.Tensor.rand(*shape, device=self.device).realize()

  def matmul(self, n: int) -> Runner:
    a, b = self._rand(n, n), self._rand(n, n)
    return lambda: (a @ b).realize()

  def elementwise(self, n: int) -> Runner:
    a, b, c = self._rand(n), self._rand(n), self._rand(n)
    return lambda: (a * b + c).relu().realize()

  def reduce_sum(self, n: int) -> Runner:
    a = self._rand(n)
    return lambda: a.sum().realize()

  def softmax(self, n: int) -> Runner:
    a = self._rand(n, n)
    return lambda: a.softmax(-1).realize()

  def conv2d(self, bs: int, cin: int, cout: int, hw: int, k: int) -> Runner:
    x, w = self._rand(bs, cin, hw, hw), self._rand(cout, cin, k, k)
    return lambda: x.conv2d(w, padding=1).realize()

  def overhead(self, n_ops: int) -> Runner:
    x = self._rand(16)

    def run() -> Any:
      y = x
      for _ in range(n_ops):
        y = (y * 1.0001 + 0.0001).realize()
      return y.sum().item()
    return run

  def overhead_jit(self, n_ops: int) -> Runner:
    TinyJit = importlib.import_module(f"{self.name}.engine.jit").TinyJit
    x = self._rand(16)

    @TinyJit
    def step(inp: Any) -> Any:
      y = inp
      for _ in range(n_ops):
        y = y * 1.0001 + 0.0001
      return y.realize()
    return lambda: step(x)

  def compile_latency(self) -> Runner:
    # a fresh constant makes every call a new kernel, so nothing comes from the method cache
    counter = [0]
    x = self._rand(64)

    def run() -> Any:
      counter[0] += 1
      return (x * float(counter[0]) + 1.2345).exp2().realize()
    return run


# ---------------------------------------------------------------- the suite

def suite(quick: bool) -> List[Tuple[str, str, Callable[[Any], Runner], float]]:
  """(name, unit, builder(framework) -> runner, work per call in unit-numerator)."""
  mm = [1024] if quick else [1024, 2048]
  n_elem = (1 << 22) if quick else (1 << 24)
  sm = 1024 if quick else 4096
  conv = (8, 64, 64, 56, 3) if quick else (32, 64, 64, 56, 3)
  items: List[Tuple[str, str, Callable[[Any], Runner], float]] = []
  for n in mm:
    items.append((f"matmul {n}x{n}", "GFLOP/s", lambda fw, n=n: fw.matmul(n), 2 * n ** 3 / 1e9))
  items.append((f"(a*b+c).relu() {n_elem >> 20}M f32", "GB/s", lambda fw: fw.elementwise(n_elem), 4 * 4 * n_elem / 1e9))
  items.append((f"sum {n_elem >> 20}M f32", "GB/s", lambda fw: fw.reduce_sum(n_elem), 4 * n_elem / 1e9))
  items.append((f"softmax {sm}x{sm}", "GB/s", lambda fw: fw.softmax(sm), 2 * 4 * sm * sm / 1e9))
  bs, cin, cout, hw, k = conv
  flops = 2 * bs * cout * hw * hw * cin * k * k / 1e9
  items.append((f"conv2d b{bs} {cin}->{cout} {hw}x{hw} {k}x{k}", "GFLOP/s", lambda fw: fw.conv2d(bs, cin, cout, hw, k), flops))
  items.append(("100 small ops, eager", "us/op", lambda fw: fw.overhead(100), 100))
  items.append(("100 small ops, jitted", "us/op", lambda fw: fw.overhead_jit(100), 100))
  items.append(("first-call compile", "ms/kernel", lambda fw: fw.compile_latency(), 1))
  return items


def frameworks(devices: List[str], peers: bool) -> List[Framework]:
  """tiny on each requested device, then the peers that are installed."""
  fws: List[Framework] = []
  for d in devices:
    fws.append(TinyLikeFW("tiny", d))
  if peers:
    fws.append(NumpyFW())
    try:
      fws.append(TorchFW())
    except ImportError:
      print("torch not installed: skipping the torch column", file=sys.stderr)
    try:
      import tinygrad  # noqa: F401
      tg_dev = importlib.import_module("tinygrad.device").Device.DEFAULT
      fws.append(TinyLikeFW("tinygrad", tg_dev))
    except Exception as e:  # tinygrad is optional; any import problem just drops the column
      print(f"tinygrad not usable ({type(e).__name__}: {e}): skipping its column", file=sys.stderr)
  return fws


def run(args: argparse.Namespace) -> List[Result]:
  """Run every benchmark on every framework that implements it."""
  results: List[Result] = []
  for name, unit, build, work in suite(args.quick):
    if args.only and not any(o in name for o in args.only):
      continue
    for fw in frameworks(args.devices, not args.no_peers):
      try:
        runner = build(fw)
      except AttributeError:
        continue  # this framework has no such workload (numpy has no conv2d)
      except Exception as e:  # a failing framework must not stop the others
        results.append(Result(name, fw.name, fw.device, float("nan"), unit, float("nan"), note=f"{type(e).__name__}: {e}"))
        continue
      try:
        med = time_it(runner, fw.sync, args.warmup, args.repeat, args.budget)
      except Exception as e:
        results.append(Result(name, fw.name, fw.device, float("nan"), unit, float("nan"), note=f"{type(e).__name__}: {e}"))
        continue
      if unit in ("us/op",):
        value = med / work * 1e6
      elif unit == "ms/kernel":
        value = med * 1e3
      else:
        value = work / med
      results.append(Result(name, fw.name, fw.device, med, unit, value, fw.peak_mem_mb()))
      print(f"{name:40s} {fw.name:9s} {fw.device:8s} {value:10.2f} {unit}", file=sys.stderr)
  return results


def lower_is_better(unit: str) -> bool:
  return unit in ("us/op", "ms/kernel")


def to_markdown(results: List[Result]) -> str:
  """One row per benchmark and tiny device; a column per peer with the tiny/peer ratio."""
  peers = sorted({r.framework for r in results if r.framework != "tiny"})
  lines = ["| benchmark | device | tiny | " + " | ".join(f"{p} | tiny/{p}" for p in peers) + " |",
           "|---|---|---|" + "---|---|" * len(peers)]
  for r in results:
    if r.framework != "tiny":
      continue
    cells = [r.bench, r.device, f"{r.value:.2f} {r.unit}" if r.value == r.value else f"failed: {r.note}"]
    for p in peers:
      peer = next((x for x in results if x.bench == r.bench and x.framework == p), None)
      if peer is None or peer.value != peer.value:
        cells += ["–", "–"]
        continue
      ratio = (peer.value / r.value) if lower_is_better(r.unit) else (r.value / peer.value)
      cells += [f"{peer.value:.2f}", f"{ratio:.2f}x"]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def machine_line() -> str:
  """Date, machine and versions, for the header of RESULTS.md."""
  versions = []
  for mod in ("tiny", "numpy", "torch", "tinygrad"):
    try:
      m = importlib.import_module(mod)
      versions.append(f"{mod} {getattr(m, '__version__', '?')}")
    except ImportError:
      pass
  return (f"{datetime.date.today().isoformat()} · {platform.machine()} · {os.cpu_count()} cores · "
          f"Python {platform.python_version()} · " + ", ".join(versions))


def main() -> None:
  """Parse arguments, run the suite and write the reports."""
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--devices", nargs="*", default=None, help="tiny devices to run (default: Device.DEFAULT)")
  ap.add_argument("--only", nargs="*", default=None, help="run benchmarks whose name contains any of these")
  ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
  ap.add_argument("--no-peers", action="store_true", help="skip numpy/torch/tinygrad")
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--repeat", type=int, default=10)
  ap.add_argument("--budget", type=float, default=5.0, help="seconds of timed runs per benchmark")
  ap.add_argument("--json", default=None, help="append JSON lines here")
  ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
  args = ap.parse_args()
  if args.devices is None:
    from tiny.device import Device
    args.devices = [Device.DEFAULT]
  results = run(args)
  table = to_markdown(results)
  print(machine_line())
  print(table)
  if args.json:
    with open(args.json, "a") as f:
      for r in results:
        f.write(json.dumps(r.__dict__) + "\n")
  if args.write:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
    with open(path, "w") as f:
      f.write(f"# Benchmark results\n\n{machine_line()}\n\nCommand: `python bench/run.py {' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
  main()
