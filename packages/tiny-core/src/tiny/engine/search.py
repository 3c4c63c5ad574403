"""BEAM search over kernel optimizations.

`beam_search(kernel, rawbufs, amt)` keeps the `amt` fastest kernels found so far, extends each with
every valid single `Opt`, compiles the candidates in worker processes, times them on the device and
repeats until nothing gets faster. The winning opt sequence is stored in the disk cache keyed by
device, AST and beam width, so a second run applies it without compiling or timing anything.
"""
from __future__ import annotations

import functools
import math
import multiprocessing
import os
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.device import Buffer, CompileError
from tiny.engine.realize import CompiledRunner
from tiny.helpers import DEBUG, CACHELEVEL, diskcache_get, diskcache_put, getenv, prod, tqdm
from tiny.ops import BufferOps, LazyOp
from tiny.registry import Device
from tiny.renderer import Program, Renderer
from tiny.shape.symbolic import Variable, _imax

# how often each stage ran, for tests and for DEBUG output
search_stats: Dict[str, int] = defaultdict(int)


def _actions() -> List[Opt]:
  """The single optimizations a search step may add (invalid ones are filtered per kernel)."""
  acts = [Opt(OptOps.UPCAST, axis, amt) for amt in (0, 2, 3, 4, 5, 7, 8) for axis in range(6)]
  acts += [Opt(OptOps.UNROLL, axis, amt) for amt in (0, 2, 4, 8) for axis in range(5)]
  acts += [Opt(OptOps.LOCAL, axis, amt) for amt in (2, 3, 4, 8, 13, 16, 29, 32) for axis in range(5)]
  acts += [Opt(OptOps.GROUPTOP, axis, amt) for amt in (13, 16, 28, 29, 32, 49, 64, 256) for axis in range(3)]
  acts += [Opt(OptOps.GROUP, axis, amt) for amt in (0, 4, 8, 16) for axis in range(3)]
  acts += [Opt(OptOps.PADTO, axis, 32) for axis in range(7)]
  acts += [Opt(OptOps.SWAP, a, b) for a in range(3) for b in range(a + 1, 4)]
  acts += [Opt(OptOps.UPCASTMID, 1, 4), Opt(OptOps.NOLOCALS, None, None)]
  acts += [Opt(OptOps.TC, axis, getenv("TC_OPT", 2)) for axis in range(4)]
  return acts


@functools.lru_cache(None)
def actions() -> Tuple[Opt, ...]:
  return tuple(_actions())


def _upcast_size(k: Kernel) -> int:
  full = getattr(k, "full_shape", ())
  upcasted = getattr(k, "upcasted", 0)
  return int(prod(full[len(full) - upcasted:])) if upcasted else 1


def get_kernel_actions(lin: Kernel, include_0: bool = True) -> Dict[int, Kernel]:
  """{action index: kernel with that action applied} for every action valid on lin (0 = lin itself)."""
  acted: Dict[int, Kernel] = {0: lin} if include_0 else {}
  max_up = getenv("BEAM_UPCAST_MAX", 256)
  for i, a in enumerate(actions()):
    lin2 = lin.copy()
    try:
      lin2.apply_opt(a)
    except KernelOptError:
      continue
    except (AssertionError, IndexError, ValueError, ZeroDivisionError):
      continue  # an action that does not fit this kernel's shape
    if _upcast_size(lin2) > max_up:
      continue
    acted[i + 1] = lin2
  return acted


def _membufs(ast: LazyOp) -> List[Any]:
  return [op.arg for op in ast.lazyops if op.op in (BufferOps.LOAD, BufferOps.STORE)]


def bufs_from_lin(lin: Kernel, allocate: bool = True) -> List[Buffer]:
  """Buffers of the right sizes and dtypes to run lin on (scratch data, for timing)."""
  by_idx: Dict[int, List[Any]] = defaultdict(list)
  for mb in _membufs(lin.ast):
    by_idx[mb.idx].append(mb)
  dev = lin.opts.device
  bufs: List[Buffer] = []
  for idx in range(len(by_idx)):
    if idx not in by_idx:
      raise RuntimeError(f"kernel buffer indices are not dense: {sorted(by_idx)}")
    size = max(_real_size(mb.st) for mb in by_idx[idx])
    b = Buffer(dev, max(size, 1), by_idx[idx][0].dtype)
    bufs.append(b.allocate() if allocate else b)
  return bufs


def _real_size(st: Any) -> int:
  sz = st.real_size()
  return int(sz if isinstance(sz, int) else sz.max)


def _var_vals(ast: LazyOp) -> Dict[Variable, int]:
  # time symbolic kernels at the middle of each variable's range (a symbolic max counts as its own int upper bound)
  return {v: (int(v.min) + _imax(v.max)) // 2 for v in ast.vars()}


def _compile(args: Tuple[LazyOp, Tuple[Opt, ...], str, Renderer]) -> Tuple[Optional[Tuple[Program, bytes]], Optional[str]]:
  """Worker: rebuild the kernel from its AST and opts, render and compile it: ((program, binary), None), or (None, why not).

  The reason comes back as text because this runs in a pool worker: the search counts and reports the failures."""
  ast, opts, dname, renderer = args
  try:
    k = Kernel(ast, opts=renderer)
    for o in opts:
      k.apply_opt(o)
    p = k.to_program()
    return (p, Device[dname].compiler.compile(p.src)), None
  except CompileError as e:
    return None, f"{opts}: {type(e).__name__}: {e}"
  except Exception as e:  # a candidate the codegen cannot handle is not a candidate; beam_search reports how many there were
    if DEBUG >= 3:
      print(f"BEAM candidate {opts} failed: {type(e).__name__}: {e}")
    return None, f"{opts}: {type(e).__name__}: {e}"


def time_program(p: Program, lib: bytes, var_vals: Dict[Variable, int], rawbufs: List[Buffer], cnt: int = 3, early_stop: float = math.inf) -> float:
  """Best of cnt timed runs of a compiled program on rawbufs (outputs are scratch)."""
  car = CompiledRunner(p, precompiled=lib)
  bufs = [rawbufs[i if isinstance(i, int) else i[0]] for i in p.globals]
  times = []
  for _ in range(cnt):
    t = car(bufs, var_vals, wait=True)
    times.append(t if t is not None else math.inf)
    if times[-1] > early_stop:
      break
  search_stats["timed"] += 1
  return min(times)


def _cache_key(lin: Kernel, amt: int, dname: str) -> Dict[str, Any]:
  return {"ast": lin.ast.key.hex() if isinstance(lin.ast.key, bytes) else str(lin.ast.key), "amt": amt, "device": dname}


def _from_cache(lin: Kernel, cached: Any) -> Optional[Kernel]:
  """lin with the cached opts ([op name, axis, amt] rows) applied; None when there are none or they do not replay
  (another version's entry): then the search runs again and overwrites it."""
  if not isinstance(cached, list):
    return None
  try:
    opts = [Opt(OptOps[op], axis, amt) for op, axis, amt in cached]
    if opts[:len(lin.applied_opts)] != list(lin.applied_opts) or \
        not all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for o in opts for x in (o.axis, o.amt)):
      return None
    ret = lin.copy()
    for o in opts[len(lin.applied_opts):]:
      ret.apply_opt(o)
  except (KernelOptError, KeyError, IndexError, TypeError, ValueError, AssertionError):
    return None
  return ret


def _pool() -> Any:
  workers = getenv("PARALLEL", min(os.cpu_count() or 1, 8))
  if workers <= 1:
    return None
  try:
    return multiprocessing.get_context("fork").Pool(workers)
  except (ValueError, OSError):
    return None


def beam_search(lin: Kernel, rawbufs: List[Buffer], amt: int, allow_test_size: bool = True, dname: Optional[str] = None,
                starts: Sequence[Kernel] = ()) -> Kernel:
  """The fastest kernel found by a beam of width amt, starting from lin (with its required opts applied).

  `starts` are more kernels of the same AST to start from (the hand-coded one, so the search never ends up slower);
  their opts must begin with lin's."""
  dname = dname or lin.opts.device
  key = _cache_key(lin, amt, dname)
  if not getenv("IGNORE_BEAM_CACHE") and CACHELEVEL >= 1 and (ret := _from_cache(lin, diskcache_get("beam_search", key))) is not None:
    search_stats["cache_hits"] += 1
    return ret
  rawbufs = [b.ensure_allocated() for b in rawbufs]
  for b in rawbufs:
    # write every page: untouched host memory maps to one shared zero page, which makes every read a cache hit and
    # would reward kernels that stream big inputs (2048² matmul timed ~1.6x too fast that way)
    b.copyin(memoryview(bytearray(b.nbytes)))
  var_vals = _var_vals(lin.ast)
  beam: List[Tuple[Kernel, float]] = []
  seen: set = set()
  # candidates that failed to compile or run are skipped; they are counted and the first reason reported once per search
  failed: List[str] = []
  pool = _pool()
  t0 = time.perf_counter()
  try:
    for start in (lin, *starts):
      first, why = _compile((start.ast, tuple(start.applied_opts), dname, start.opts))
      if why is not None:
        failed.append(why)
      if first is not None and first[0].src not in seen:
        seen.add(first[0].src)
        beam.append((start, time_program(*first, var_vals, rawbufs)))
    beam = sorted(beam, key=lambda x: x[1])[:amt] or [(lin, math.inf)]
    bar = tqdm(desc=f"BEAM {amt}", total=None, disable=DEBUG < 1 and not getenv("BEAM_PROGRESS", 1), leave=False)
    while True:
      candidates = [k for b, _ in beam for k in get_kernel_actions(b, include_0=False).values()]
      if not candidates:
        break
      jobs = [(c.ast, tuple(c.applied_opts), dname, c.opts) for c in candidates]
      compiled = pool.imap(_compile, jobs) if pool is not None else map(_compile, jobs)
      timed: List[Tuple[Kernel, float]] = []
      least = beam[0][1]
      for c, (res, why) in zip(candidates, compiled):
        search_stats["compiled"] += 1
        bar.update(1)
        if why is not None:
          failed.append(why)
        if res is None or res[0].src in seen:
          continue
        seen.add(res[0].src)
        try:
          tm = time_program(res[0], res[1], var_vals, rawbufs, early_stop=least * 3 if least < math.inf else math.inf)
        except Exception as e:  # a kernel that fails to launch is discarded (counted in `failed`)
          if DEBUG >= 3:
            print(f"BEAM timing of {c.applied_opts} failed: {e}")
          failed.append(f"{tuple(c.applied_opts)}: running it raised {type(e).__name__}: {e}")
          continue
        timed.append((c, tm))
      opts = sorted(beam + timed, key=lambda x: x[1])[:amt]
      if opts[0][1] >= beam[0][1] or not timed:
        break
      beam = opts
      if hasattr(bar, "set_description"):
        bar.set_description(f"BEAM {amt}: {beam[0][1] * 1e6:10.2f} us {beam[0][0].applied_opts}")
    bar.close()
  finally:
    if pool is not None:
      pool.close()
      pool.join()
  best = beam[0][0]
  search_stats["failed"] += len(failed)
  if failed and DEBUG >= 1:
    print(f"BEAM {amt}: skipped {len(failed)} candidate(s) that failed to compile or run; the first: {failed[0]}")
  if DEBUG >= 1:
    print(f"BEAM {amt}: {beam[0][1] * 1e6:.2f} us in {time.perf_counter() - t0:.2f} s with {best.applied_opts}")
  if CACHELEVEL >= 1:
    diskcache_put("beam_search", key, [[o.op.name, o.axis, o.amt] for o in best.applied_opts])
  return best
