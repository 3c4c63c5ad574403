"""The outcome table of the hostile corpus: `python -m tests.hostile.outcomes [--timeout S] [--mem-mib M]`.

Each case of weight_files.CASES is loaded in its own subprocess (so a segfault, a hang or a memory blow-up is an outcome,
not the end of the run) and classified: `refused` (WeightFileError), `loaded` (a clean load), `raw <Type>` (any other
exception), `signal N`, `timeout` or `memory` (over the address-space limit). Run it against another checkout by putting
that checkout's src folders first on PYTHONPATH; the cases themselves come from this folder.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

# the child: build nothing, just load the file it is given and say how that went on its last stdout line
_CHILD = r"""
import json, resource, sys
lim = int(sys.argv[3]) << 20
resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
fmt, fn, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[4])
def touch(x, seen):
  # every tensor reachable once: loaded structures may share and even contain themselves
  if id(x) in seen: return
  seen.add(id(x))
  if isinstance(x, dict): x = list(x.values())
  if isinstance(x, (list, tuple)):
    for y in x: touch(y, seen)
  elif hasattr(x, "numpy"): x.numpy()
try:
  from tiny_nn.state import WeightFileError, gguf_load, safe_load, torch_load
  touch(safe_load(fn) if fmt == "safetensors" else gguf_load(fn)[1] if fmt == "gguf" else torch_load(fn, **kwargs), set())
  print("\nloaded")
except MemoryError:
  print("\nmemory")
except WeightFileError:
  print("\nrefused")
except BaseException as e:
  print("\nraw " + type(e).__name__)
"""

EXT = {"safetensors": ".safetensors", "pth": ".pth", "pth-legacy": ".pth", "gguf": ".gguf"}


def outcome(fmt: str, fn: Path, timeout: float, mem_mib: int, kwargs: Dict[str, Any]) -> str:
  """How loading fn in a fresh interpreter ended."""
  try:
    p = subprocess.run([sys.executable, "-c", _CHILD, fmt, str(fn), str(mem_mib), json.dumps(kwargs)], capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return "timeout"
  if p.returncode < 0:
    return f"signal {-p.returncode}"
  lines = p.stdout.strip().splitlines()
  return lines[-1] if lines else f"exit {p.returncode}"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--timeout", type=float, default=20.0, help="seconds before a load counts as a hang")
  ap.add_argument("--mem-mib", type=int, default=4096, help="address-space limit of each load")
  args = ap.parse_args()
  from .weight_files import CASES
  counts: collections.Counter = collections.Counter()
  with tempfile.TemporaryDirectory() as d:
    for case in CASES:
      fn = Path(d) / f"{case.name}{EXT[case.fmt]}"
      fn.write_bytes(case.build())
      got = outcome(case.fmt, fn, args.timeout, args.mem_mib, dict(case.kwargs))
      want = "loaded" if case.loads is not None else "refused"
      counts["ok" if got == want else "bad"] += 1
      print(f"{case.name:45s} {case.fmt:12s} {got:22s} {'ok' if got == want else 'WANTED ' + want}", flush=True)
      os.unlink(fn)
  print(f"\n{counts['ok']} of {len(CASES)} cases end as intended, {counts['bad']} do not")


if __name__ == "__main__":
  main()
