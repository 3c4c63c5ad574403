"""tiny on a GPU against torch on the same GPU, in one process: `python bench/gpu.py --device CUDA --torch-device cuda`.

Each row runs a few warm-up calls, then times `--repeat` calls (each call is realized and the device synchronized) and
reports the median as throughput and the ratio tiny/torch (above 1 means tiny is faster). Also runs on CPU devices
(`--device CLANG --torch-device cpu`), which is how CI-less machines check the script itself.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, List, Tuple

import numpy as np


def _median_s(run: Callable[[], Any], sync: Callable[[], None], warmup: int, repeat: int) -> float:
  for _ in range(warmup):
    run()
  sync()
  times = []
  for _ in range(repeat):
    st = time.perf_counter()
    run()
    sync()
    times.append(time.perf_counter() - st)
  return statistics.median(times)


def rows(n_mm: int, n_ew: int, n_sm: int) -> List[Tuple[str, str, float, Callable[..., Any], Callable[..., Any]]]:
  """(name, unit, work per call, tiny builder, torch builder): a builder takes its framework's inputs and returns the call."""
  fl = 2.0 * n_mm ** 3
  return [
    (f"matmul {n_mm}² f32", "GFLOP/s", fl, lambda a, b: (lambda: (a @ b).realize()), lambda a, b: (lambda: a @ b)),
    (f"matmul {n_mm}² f16", "GFLOP/s", fl, lambda a, b: (lambda: (a.half() @ b.half()).realize()),
     lambda a, b: (lambda: a.half() @ b.half())),
    (f"(a*b+c).relu() {n_ew / 2**20:g}M f32", "GB/s", 16.0 * n_ew, lambda a, b: (lambda: (a * b + a).relu().realize()),
     lambda a, b: (lambda: (a * b + a).relu())),
    (f"sum {n_ew / 2**20:g}M f32", "GB/s", 4.0 * n_ew, lambda a, b: (lambda: a.sum().realize()), lambda a, b: (lambda: a.sum())),
    (f"softmax {n_sm}² f32", "GB/s", 8.0 * n_sm * n_sm, lambda a, b: (lambda: a.softmax(-1).realize()),
     lambda a, b: (lambda: a.softmax(-1))),
  ]


def main() -> None:
  """Print a markdown table of tiny vs torch on one device pair."""
  ap = argparse.ArgumentParser(description=__doc__)
  ap.add_argument("--device", default="CUDA")
  ap.add_argument("--torch-device", default="cuda")
  ap.add_argument("--size", choices=["full", "small"], default="full")
  ap.add_argument("--warmup", type=int, default=3)
  ap.add_argument("--repeat", type=int, default=10)
  args = ap.parse_args()
  import torch

  from tiny.registry import Device
  from tiny.tensor import Tensor
  n_mm, n_ew, n_sm = (4096, 1 << 26, 4096) if args.size == "full" else (256, 1 << 16, 256)
  tdev = torch.device(args.torch_device)
  tsync = (lambda: torch.cuda.synchronize()) if tdev.type == "cuda" else (lambda: None)
  ysync = Device[args.device].synchronize
  rng = np.random.default_rng(0)
  print(f"tiny {args.device} vs torch {torch.__version__} on {args.torch_device}"
        + (f" ({torch.cuda.get_device_name()})" if tdev.type == "cuda" else ""))
  print("| benchmark | unit | tiny | torch | tiny/torch |\n|---|---|---|---|---|")
  for name, unit, work, tiny_fn, torch_fn in rows(n_mm, n_ew, n_sm):
    shape = (n_mm, n_mm) if "matmul" in name else (n_sm, n_sm) if "softmax" in name else (n_ew,)
    a, b = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
    ta, tb = Tensor(a, device=args.device).realize(), Tensor(b, device=args.device).realize()
    pa, pb = torch.from_numpy(a).to(tdev), torch.from_numpy(b).to(tdev)
    # the same answer first: a fast wrong kernel is no result
    got, want = tiny_fn(ta, tb)().numpy().astype(np.float64), torch_fn(pa, pb)().float().cpu().numpy().astype(np.float64)
    scale = max(1.0, float(np.abs(want).max()))
    if not np.allclose(got, want, rtol=2e-2, atol=2e-2 * scale):
      print(f"| {name} | {unit} | WRONG (max abs diff {np.abs(got - want).max():.3g}) | | |")
      continue
    t_tiny = _median_s(tiny_fn(ta, tb), ysync, args.warmup, args.repeat)
    t_torch = _median_s(torch_fn(pa, pb), tsync, args.warmup, args.repeat)
    scale_unit = 1e9
    print(f"| {name} | {unit} | {work / t_tiny / scale_unit:.1f} | {work / t_torch / scale_unit:.1f} | {t_torch / t_tiny:.2f}x |")


if __name__ == "__main__":
  main()
