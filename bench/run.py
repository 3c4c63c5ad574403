"""Benchmark tiny against numpy, torch (CPU) and tinygrad in one process.

Run `python bench/run.py` (or `nox -s bench`). Each benchmark runs after warm-up; we report the median
of several timed runs, the throughput, and the ratio tiny/peer (above 1 means tiny is faster).
Results go to stdout as a markdown table, to `bench/RESULTS.md` with `--write`, and as JSON lines to
`--json FILE`. Model benchmarks live in `bench/models/` (GPT-2 and an MNIST-style CNN).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib
import importlib.metadata
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
  first_call_s: Optional[float] = None
  load: Optional[float] = None  # 1-minute load average when the benchmark finished (the machine may be shared)


def time_it(fn: Runner, sync: Callable[[], None], warmup: int, repeat: int, budget_s: float,
            after_call: Optional[Callable[[], None]] = None) -> Tuple[float, float]:
  """(median wall time of fn() after warm-up, time of the very first call); stops early when the time budget is used up."""
  first = 0.0
  for i in range(warmup):
    st = time.perf_counter()
    fn()
    sync()
    if i == 0:
      first = time.perf_counter() - st
    if after_call is not None:
      after_call()
  times: List[float] = []
  start = time.perf_counter()
  for _ in range(repeat):
    st = time.perf_counter()
    fn()
    sync()
    times.append(time.perf_counter() - st)
    if after_call is not None:
      after_call()
    if time.perf_counter() - start > budget_s and len(times) >= 3:
      break
  return statistics.median(times), first


def first_call_in_subprocess(code: str, env: Dict[str, str]) -> float:
  """Seconds of a first call, measured by a fresh Python process (empty in-memory caches, an empty compile cache dir).

  `code` runs with `bench/` on sys.path and must print the seconds as its last stdout line."""
  import subprocess
  import tempfile
  with tempfile.TemporaryDirectory(prefix="bench_first_call_") as d:
    full_env = {**os.environ, **env, "CACHEDB": os.path.join(d, "cache.db"), "XDG_CACHE_HOME": d, "PROGRESS": "0"}
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {bench_dir!r})\n{code}"], env=full_env,
                          capture_output=True, text=True, timeout=1800)
  if proc.returncode != 0:
    raise RuntimeError(f"first-call child failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
  return float(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- frameworks

class Framework:
  """Adapter that builds the workloads for one framework and device."""

  name = ""
  device = "CPU"
  backend = ""  # how the framework executes on this device, for the report
  note = ""  # set by a workload that had to deviate from the plan; run() moves it into the result
  mem_note = ""  # "" exact peak, ">=" a lower bound (sampled between calls)

  def sync(self) -> None:
    pass

  def mem_start(self) -> None:
    """Start tracking the peak of device memory for one benchmark."""

  def mem_sample(self) -> None:
    """Called after every call of a runner, for frameworks that can only sample the memory in use."""

  def peak_mem_mb(self) -> Optional[float]:
    """Peak device memory since mem_start, in MB, or None when the framework does not track it."""
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

  def overhead(self, n_ops: int) -> Runner:
    x = np.random.rand(16).astype(np.float32)

    def run() -> Any:
      y = x
      for _ in range(n_ops):
        y = y * np.float32(1.0001) + np.float32(0.0001)
      return float(y.sum())
    return run


class TorchFW(Framework):
  name = "torch"

  def __init__(self) -> None:
    import torch
    self.torch = torch
    torch.manual_seed(0)
    self.backend = f"eager, {torch.get_num_threads()} threads"

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

  def mnist_step(self, batch: int) -> Runner:
    from models.mnist_cnn import torch_step
    return torch_step(batch)

  def mnist_first_call(self, batch: int) -> Runner:
    code = ("import time\nfrom models.mnist_cnn import torch_step\n"
            f"run = torch_step({batch})\nst = time.perf_counter(); float(run()); print(time.perf_counter() - st)")
    return lambda: first_call_in_subprocess(code, {})

  def gpt2(self, cfg: Any, weights: Any, prompt_len: int, phase: str) -> Runner:
    from models.gpt2 import torch_runners
    prefill, decode, _ = torch_runners(weights, cfg, prompt_len)
    if phase == "decode":
      prefill()  # fill the cache with the prompt first
      return decode
    return prefill


class TinyLikeFW(Framework):
  """tiny and tinygrad share the Tensor API, so one adapter serves both."""

  def __init__(self, module: str, device: str) -> None:
    self.mod = importlib.import_module(module)
    self.name, self.device = module, device
    self.Tensor = self.mod.Tensor
    self.Device = importlib.import_module(f"{module}.device").Device
    self.GlobalCounters = importlib.import_module(f"{module}.helpers").GlobalCounters
    self.Tensor.manual_seed(0)
    dev = self.Device[device]
    parts = [type(getattr(dev, a)).__name__ for a in ("renderer", "compiler") if getattr(dev, a, None) is not None]
    self.backend = "/".join(parts)
    if module == "tiny" and device in ("CLANG", "LLVM"):
      from tiny_clang.pool import num_threads  # type: ignore[import-not-found]
      self.backend += f", {num_threads()} threads"
    self.tracks_peak = hasattr(self.GlobalCounters, "mem_peak")
    self.mem_note = "" if self.tracks_peak else ">="
    self._base, self._peak = 0, 0

  def sync(self) -> None:
    self.Device[self.device].synchronize()

  def mem_start(self) -> None:
    gc.collect()
    self._base = self._peak = self.GlobalCounters.mem_used
    if self.tracks_peak:
      self.GlobalCounters.mem_peak = self.GlobalCounters.mem_used

  def mem_sample(self) -> None:
    self._peak = max(self._peak, self.GlobalCounters.mem_used)

  def peak_mem_mb(self) -> Optional[float]:
    peak = self.GlobalCounters.mem_peak if self.tracks_peak else self._peak
    return (peak - self._base) / 1e6

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

  def mnist_step(self, batch: int) -> Runner:
    from models.mnist_cnn import tensor_step
    return tensor_step(self.name, batch)

  def mnist_first_call(self, batch: int) -> Runner:
    # the step is built (weights initialized) before the clock starts: the figure is the first forward+backward+Adam
    # step, scheduling and compiling every kernel of it with nothing cached
    code = ("import time\nfrom models.mnist_cnn import tensor_step\n"
            f"run = tensor_step({self.name!r}, {batch})\nst = time.perf_counter(); run().numpy(); print(time.perf_counter() - st)")
    return lambda: first_call_in_subprocess(code, {self.device.split(":")[0]: "1"})

  def gpt2(self, cfg: Any, weights: Any, prompt_len: int, phase: str) -> Runner:
    from models.gpt2 import tensor_runners
    if phase != "decode":
      return tensor_runners(self.name, weights, cfg, prompt_len)[0]
    # symbolic shapes first (keys shrunk to the filled length); if this build cannot run them, attend over the whole
    # cache with a mask, and say so in the table
    try:
      prefill, decode, _ = tensor_runners(self.name, weights, cfg, prompt_len, attention="symbolic")
      prefill()  # fill the cache with the prompt first
      decode()
      return decode
    except Exception as e:
      self.note = f"masked attention (symbolic failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
      print(f"{self.name}: {self.note}", file=sys.stderr)
    prefill, decode, _ = tensor_runners(self.name, weights, cfg, prompt_len, attention="masked")
    prefill()
    return decode

  def compile_latency(self) -> Runner:
    # a fresh constant makes every call a new kernel, so nothing comes from the method cache; the constants start at a
    # random point, or a second run would find the first run's kernels in the disk cache
    counter = [int.from_bytes(os.urandom(3), "little")]
    x = self._rand(64)

    def run() -> Any:
      # steps of 2**-20 in [1, 2): exact in float32 (and float64), so every call's constant is another number
      counter[0] += 1
      return (x * (1.0 + (counter[0] % (1 << 20)) * 2.0 ** -20) + 1.2345).exp2().realize()
    return run


# ---------------------------------------------------------------- the suite

@dataclass
class Bench:
  """One benchmark: how to build its runner on a framework, and how to turn a call's time into the reported figure."""

  name: str
  unit: str
  build: Callable[[Any], Runner]
  work: float  # per call, in the unit's numerator (GFLOP, GB, tokens, steps, ops)
  min_warmup: int = 1  # jitted workloads need 2 (run, capture) before the replays that are timed
  config: str = ""
  self_timed: bool = False  # the runner measures itself and returns seconds (a first call in a fresh process)


def suite(args: argparse.Namespace) -> List[Bench]:
  """The benchmarks, sized by --quick / --gpt2 / --mnist-batch."""
  from models.gpt2 import flops_per_token, get_config
  quick = args.quick
  mm = [1024] if quick else [1024, 2048]
  n_elem = (1 << 22) if quick else (1 << 24)
  sm = 1024 if quick else 4096
  conv = (8, 64, 64, 56, 3) if quick else (32, 64, 64, 56, 3)
  items: List[Bench] = []
  for n in mm:
    items.append(Bench(f"matmul {n}x{n}", "GFLOP/s", functools.partial(lambda fw, n: fw.matmul(n), n=n), 2 * n ** 3 / 1e9))
  items.append(Bench(f"(a*b+c).relu() {n_elem >> 20}M f32", "GB/s", lambda fw: fw.elementwise(n_elem), 4 * 4 * n_elem / 1e9))
  items.append(Bench(f"sum {n_elem >> 20}M f32", "GB/s", lambda fw: fw.reduce_sum(n_elem), 4 * n_elem / 1e9))
  items.append(Bench(f"softmax {sm}x{sm}", "GB/s", lambda fw: fw.softmax(sm), 2 * 4 * sm * sm / 1e9))
  bs, cin, cout, hw, k = conv
  flops = 2 * bs * cout * hw * hw * cin * k * k / 1e9
  items.append(Bench(f"conv2d b{bs} {cin}->{cout} {hw}x{hw} {k}x{k}", "GFLOP/s", lambda fw: fw.conv2d(bs, cin, cout, hw, k), flops))
  mb = args.mnist_batch or (16 if quick else 64)
  items.append(Bench(f"MNIST CNN train step b{mb}", "steps/s", lambda fw: fw.mnist_step(mb), 1, min_warmup=2,
                     config=f"batch {mb}, Adam, 2x conv5x5(32)+BN+pool, 2x conv3x3(64)+BN+pool, linear"))
  cfg = get_config(args.gpt2 or ("micro" if quick else "small"))
  plen = args.gpt2_prompt or (16 if quick else 128)
  if plen + 2 > cfg.max_context:
    cfg = type(cfg)(**{**cfg.__dict__, "max_context": plen + 64})
  weights_cache: Dict[str, Any] = {}

  def weights() -> Any:
    from models.gpt2 import random_weights
    if "w" not in weights_cache:
      weights_cache["w"] = random_weights(cfg)
    return weights_cache["w"]
  items.append(Bench(f"{cfg.name} prefill {plen} tok", "tok/s", lambda fw: fw.gpt2(cfg, weights(), plen, "prefill"), plen, min_warmup=2,
                     config=cfg.describe() + f"; prompt {plen}; {flops_per_token(cfg, plen) * plen / 1e9:.1f} GFLOP per call"))
  items.append(Bench(f"{cfg.name} decode 1 tok (KV cache)", "tok/s", lambda fw: fw.gpt2(cfg, weights(), plen, "decode"), 1, min_warmup=2,
                     config=cfg.describe() + f"; context {plen}..{cfg.max_context - 1}, position a bound Variable"))
  items.append(Bench("100 small ops, eager", "us/op", lambda fw: fw.overhead(100), 100))
  items.append(Bench("100 small ops, jitted", "us/op", lambda fw: fw.overhead_jit(100), 100, min_warmup=2))
  items.append(Bench("first-call compile", "ms/kernel", lambda fw: fw.compile_latency(), 1))
  items.append(Bench(f"MNIST train step b{mb} first call, empty cache", "s", lambda fw: fw.mnist_first_call(mb), 1, self_timed=True,
                     config="fresh process and compile cache dir; model built before the clock starts"))
  return items


def tiny_devices() -> List[str]:
  """tiny's usable compiled devices (PYTHON, the interpreter, is left out: it is a reference, not a fast path)."""
  from tiny.device import Device
  return [d for d in Device.get_available_devices() if d != "PYTHON"]


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
      # tiny runs on the host CPU here, so tinygrad does too: left to itself it picks any OpenCL device, and that is PoCL
      # (also a CPU, through another compiler) wherever tiny-opencl's tests installed it. TINYGRAD_DEV picks another.
      os.environ.setdefault("DEV", os.environ.get("TINYGRAD_DEV", "CPU"))
      import tinygrad  # noqa: F401
      tg_dev = importlib.import_module("tinygrad.device").Device.DEFAULT
      fws.append(TinyLikeFW("tinygrad", tg_dev))
    except Exception as e:  # tinygrad is optional; any import problem just drops the column
      print(f"tinygrad not usable ({type(e).__name__}: {e}): skipping its column", file=sys.stderr)
  return fws


def figure(b: Bench, median_s: float) -> float:
  """The reported value for one call's median time."""
  if b.unit == "us/op":
    return median_s / b.work * 1e6
  if b.unit == "ms/kernel":
    return median_s * 1e3
  if b.unit == "s":
    return median_s
  return b.work / median_s


def run(args: argparse.Namespace) -> List[Result]:
  """Run every benchmark on every framework that implements it."""
  results: List[Result] = []
  fws = frameworks(args.devices, not args.no_peers)
  only_fw = set(args.frameworks) if args.frameworks else None
  for b in suite(args):
    if args.only and not any(o in b.name for o in args.only):
      continue
    for fw in fws:
      if only_fw and fw.name not in only_fw:
        continue
      gc.collect()
      fw.note = ""
      fw.mem_start()
      try:
        runner = build_runner(b, fw)
        if runner is None:
          continue  # this framework has no such workload (numpy has no conv2d)
        if b.self_timed:
          # each call is a whole fresh process: a few are enough, and there is nothing to warm up
          secs = [float(runner()) for _ in range(max(1, min(args.repeat, getattr(args, "first_call_repeat", 3))))]
          med, first = statistics.median(secs), secs[0]
        else:
          med, first = time_it(runner, fw.sync, max(args.warmup, b.min_warmup), args.repeat, args.budget, fw.mem_sample)
      except Exception as e:  # a failing framework must not stop the others
        msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
        results.append(Result(b.name, fw.name, fw.device, float("nan"), b.unit, float("nan"), note=msg, load=os.getloadavg()[0]))
        print(f"{b.name:40s} {fw.name:9s} {fw.device:8s} FAILED {msg}", file=sys.stderr)
        continue
      finally:
        runner = None
      value = figure(b, med)
      peak = fw.peak_mem_mb()
      results.append(Result(b.name, fw.name, fw.device, med, b.unit, value, peak, note=fw.mem_note if peak is not None else "",
                            extra={"config": b.config, "backend": fw.backend, "deviation": fw.note}, first_call_s=first,
                            load=os.getloadavg()[0]))
      fw.note = ""
      mem = f"{fw.mem_note}{peak:.1f} MB" if peak is not None else "-"
      print(f"{b.name:40s} {fw.name:9s} {fw.device:8s} {value:10.2f} {b.unit:9s} first {first:7.2f}s  peak {mem}  "
            f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
  return results


def build_runner(b: Bench, fw: Framework) -> Optional[Runner]:
  """The runner of `b` on `fw`, or None when the framework has no such workload."""
  try:
    return b.build(fw)
  except AttributeError as e:
    if e.obj is fw:  # the adapter lacks the method: not a failure
      return None
    raise


def lower_is_better(unit: str) -> bool:
  return unit in ("us/op", "ms/kernel", "s")


def fmt(v: float) -> str:
  return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3g}"


def of_limit(r: Result, limits: Any) -> str:
  """tiny's figure as a fraction of the machine's limit for its unit (FMA peak for GFLOP/s, stream bandwidth for GB/s)."""
  if limits is None or r.value != r.value:
    return "–"
  limit = {"GFLOP/s": limits.peak_gflops, "GB/s": limits.stream_gbs}.get(r.unit)
  return "–" if limit is None else f"{r.value / limit:.0%}"


def to_markdown(results: List[Result], limits: Any = None) -> str:
  """One row per benchmark and tiny device; tiny as a fraction of the machine's limit (bench/limits.py) for throughput
  rows, and a column per peer with the tiny/peer ratio (above 1: tiny is faster)."""
  peers = [p for p in ("numpy", "torch", "tinygrad") if any(r.framework == p for r in results)]
  head = "| benchmark | unit | device | tiny | of limit | tiny peak MB | " + " | ".join(f"{p} | tiny/{p}" for p in peers) + " | peer peak MB |"
  lines = [head, "|---|---|---|---|---|---|" + "---|---|" * len(peers) + "---|"]
  for r in results:
    if r.framework != "tiny":
      continue
    tiny_cell = (f"{fmt(r.value)}" + (" (note)" if r.extra.get("deviation") else "")) if r.value == r.value else f"failed: {r.note}"
    cells = [r.bench, r.unit, r.device, tiny_cell, of_limit(r, limits), "–" if r.peak_mem_mb is None else f"{r.peak_mem_mb:,.1f}"]
    peer_mem = []
    for p in peers:
      peer = next((x for x in results if x.bench == r.bench and x.framework == p), None)
      if peer is None:
        cells += ["–", "–"]
        continue
      if peer.value != peer.value:
        cells += [f"failed: {peer.note}", "–"]
        continue
      if peer.peak_mem_mb is not None:
        peer_mem.append(f"{p} {peer.note}{peer.peak_mem_mb:,.1f}")
      if r.value != r.value:
        cells += [fmt(peer.value), "–"]
        continue
      ratio = (peer.value / r.value) if lower_is_better(r.unit) else (r.value / peer.value)
      cells += [fmt(peer.value), f"{ratio:.2f}x"]
    cells.append(", ".join(peer_mem) or "–")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def configs_md(results: List[Result]) -> str:
  """The configuration of the model benchmarks, and each framework's backend."""
  seen: Dict[str, str] = {}
  for r in results:
    if r.extra.get("config") and r.bench not in seen:
      seen[r.bench] = r.extra["config"]
  lines = [f"- **{k}**: {v}" for k, v in seen.items()]
  backends = {}
  for r in results:
    if r.extra.get("backend") is not None:
      backends[f"{r.framework} {r.device}"] = r.extra["backend"]
  lines += [f"- backend {k}: {v or 'n/a'}" for k, v in backends.items()]
  lines += [f"- note, {r.framework} {r.device} on {r.bench}: {r.extra['deviation']}" for r in results if r.extra.get("deviation")]
  return "\n".join(lines)


def versions() -> str:
  out = []
  for dist in ("tiny-core", "tiny-clang", "numpy", "torch", "tinygrad", "llvmlite"):
    try:
      out.append(f"{dist} {importlib.metadata.version(dist)}")
    except importlib.metadata.PackageNotFoundError:
      pass
  return ", ".join(out)


def machine_line() -> str:
  """Date, machine and versions, for the header of RESULTS.md."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
  except OSError:
    pass
  return (f"{datetime.datetime.now().isoformat(timespec='minutes')} · {cpu} · {os.cpu_count()} cores · "
          f"Python {platform.python_version()} · {versions()}")


def main() -> None:
  """Parse arguments, run the suite and write the reports."""
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--devices", nargs="*", default=None, help="tiny devices to run (default: every available compiled device)")
  ap.add_argument("--only", nargs="*", default=None, help="run benchmarks whose name contains any of these")
  ap.add_argument("--frameworks", nargs="*", default=None, help="run only these frameworks (tiny numpy torch tinygrad)")
  ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
  ap.add_argument("--no-peers", action="store_true", help="skip numpy/torch/tinygrad")
  ap.add_argument("--gpt2", default=None, help="GPT-2 size: small (default), mini, micro (--quick) or 'layers,embd,heads[,vocab]'")
  ap.add_argument("--gpt2-prompt", type=int, default=None, help="prefill length (default 128; 16 with --quick)")
  ap.add_argument("--mnist-batch", type=int, default=None, help="MNIST CNN batch size (default 64; 16 with --quick)")
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--repeat", type=int, default=10)
  ap.add_argument("--budget", type=float, default=5.0, help="seconds of timed runs per benchmark")
  ap.add_argument("--first-call-repeat", type=int, default=3, help="fresh processes per first-call benchmark (median reported)")
  ap.add_argument("--json", default=None, help="append JSON lines here")
  ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
  ap.add_argument("--no-limits", action="store_true", help="skip measuring the machine's FMA peak and stream bandwidth")
  args = ap.parse_args()
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/models, bench/limits.py
  import limits
  if args.devices is None:
    args.devices = tiny_devices()
  load_before = os.getloadavg()
  t0 = time.perf_counter()
  # the limits first, on a machine not yet warm from the suite (measured again at the end: the larger pair is kept)
  lim = None if args.no_limits else limits.measure()
  results = run(args)
  if lim is not None:
    limits.measure.cache_clear()
    if (again := limits.measure()) is not None:
      lim = limits.Limits(max(lim.peak_gflops, again.peak_gflops), max(lim.stream_gbs, again.stream_gbs), lim.threads, lim.vector_bytes,
                          max(lim.copy_gbs, again.copy_gbs), max(lim.read_gbs, again.read_gbs))
  elapsed = time.perf_counter() - t0
  table = to_markdown(results, lim)
  load = f"load average {load_before[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end ({elapsed / 60:.1f} min)"
  if lim is not None:
    load += f"\n\nLimits of this machine: {lim.describe()}"
  print(machine_line())
  print(load)
  print(table)
  print(configs_md(results))
  if args.json:
    with open(args.json, "a") as f:
      for r in results:
        f.write(json.dumps({**r.__dict__, "machine": machine_line()}) + "\n")
  if args.write:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
    with open(path, "w") as f:
      f.write(f"# Benchmark results\n\n{machine_line()}\n\n{load}\n\nCommand: `python bench/run.py {' '.join(sys.argv[1:])}`\n\n"
              f"{table}\n\n{configs_md(results)}\n")


if __name__ == "__main__":
  main()
