"""The same small programs compiled under different kernel optimizations, each against numpy: no opts (NOOPT=1), the
hand-coded heuristics (the default), BEAM=2 search, explicit opt lists (UPCAST, UNROLL, SWAP, and LOCAL/GROUP where
the renderer has local memory), and every single opt BEAM may try.

The kernels are built here from each ScheduleItem's AST (Kernel + opts -> Program -> CompiledRunner on the device),
so what runs is exactly the opt setting named by the test, whatever the method cache or the BEAM disk cache hold.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine import pending
from tiny.engine.realize import CompiledRunner, ExecItem, lower_schedule_item
from tiny.engine.search import beam_search, bufs_from_lin, get_kernel_actions, search_stats
from tiny.helpers import Context
from tiny.ops import MetaOps
from tiny.registry import Device
from tiny.tensor import Tensor

from ._kit import QUICK, check, data, quick_cases

F32 = dtypes.float32
Program = Tuple[Callable[[str], Tensor], np.ndarray, float]


def _ew_reduce() -> Program:
  a, b = data((12, 32), F32, seed=1), data((12, 32), F32, seed=2)
  return (lambda d: (Tensor(a, device=d) * Tensor(b, device=d) - Tensor(a, device=d).abs()).sum(1),
          (a.astype(np.float64) * b - np.abs(a)).sum(1), 1e-5)


def _matmul() -> Program:
  a, b = data((8, 16), F32, seed=3), data((16, 12), F32, seed=4)
  return lambda d: Tensor(a, device=d) @ Tensor(b, device=d), a.astype(np.float64) @ b, 1e-5


def _padded_conv() -> Program:
  x, w = data((1, 2, 8, 8), F32, seed=5), data((4, 2, 3, 3), F32, seed=6)
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  want = np.zeros((1, 4, 8, 8))
  for i in range(3):
    for j in range(3):
      want += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], w[:, :, i, j].astype(np.float64))
  return lambda d: Tensor(x, device=d).conv2d(Tensor(w, device=d), padding=1), want, 1e-5


def _multi_axis_reduce() -> Program:
  a = data((4, 6, 8), F32, seed=7)
  return lambda d: (Tensor(a, device=d) * 2 + 1).sum((0, 2)), (a.astype(np.float64) * 2 + 1).sum((0, 2)), 1e-5


PROGRAMS: Dict[str, Callable[[], Program]] = {"ew_reduce": _ew_reduce, "matmul": _matmul, "padded_conv": _padded_conv,
                                             "multi_axis_reduce": _multi_axis_reduce}


def _kernels_and_run(out: Tensor, device: str, choose: Callable[[Kernel], Kernel]) -> List[Kernel]:
  """Realize out with every kernel built by choose(Kernel(ast)); the other items (copies) run as usual."""
  sched, var_vals = out.schedule_with_vars()
  used = []
  for si in sched:
    if si.ast.op is MetaOps.KERNEL:
      pending.claim(si)   # the result checked must be this kernel's, not the item run again as pending
      k = choose(Kernel(si.ast, opts=Device[device].renderer))
      runner = CompiledRunner(replace(k.to_program(), dname=device))
      ei = ExecItem(runner, [si.bufs[g[0] if isinstance(g, tuple) else g] for g in runner.p.globals])
      used.append(k)
    else:
      ei = lower_schedule_item(si)
    ei.run(var_vals)
  assert used, "the program compiled no kernel"
  return used


def _run_program(name: str, device: str, choose: Callable[[Kernel], Kernel], what: str) -> List[Kernel]:
  build, want, tol = PROGRAMS[name]()
  out = build(device)
  ks = _kernels_and_run(out, device, choose)
  check(out, want, dt=F32, atol=tol, rtol=tol, what=f"{name} {what} (opts {[k.applied_opts for k in ks]})")
  return ks


# *** the three settings a user picks with NOOPT / (nothing) / BEAM ***

def _noopt(k: Kernel, device: str) -> Kernel:
  return k.required_optimizations()


def _heuristic(k: Kernel, device: str) -> Kernel:
  return k.hand_coded_optimizations()


def _beam2(k: Kernel, device: str) -> Kernel:
  # the device, not the renderer's plain name: a renderer variant (CUDA:PTX) compiles with its own compiler
  base = Kernel(k.ast, opts=k.opts).required_optimizations()
  return beam_search(base, bufs_from_lin(base, allocate=False), 2, dname=device,
                     starts=[Kernel(k.ast, opts=k.opts).hand_coded_optimizations()])


SETTINGS: Dict[str, Callable[[Kernel, str], Kernel]] = {"NOOPT": _noopt, "heuristic": _heuristic, "BEAM=2": _beam2}
CASES = [(p, s) for p in PROGRAMS for s in SETTINGS]


@pytest.mark.parametrize("program,setting", quick_cases(CASES, lambda c: c in (("matmul", "NOOPT"), ("padded_conv", "heuristic"),
                                                                                ("multi_axis_reduce", "NOOPT")),
                                                        ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_setting(program, setting, tiny_device, monkeypatch):
  # BEAM: search on the device now (not opts cached by an earlier run), in this process (small kernels: no worker pool)
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
  monkeypatch.setenv("PARALLEL", "0")
  ks = _run_program(program, tiny_device, lambda k: SETTINGS[setting](k, tiny_device), setting)
  if setting == "NOOPT":
    assert all(not k.applied_opts for k in ks), f"NOOPT kernels should have no opts, got {[k.applied_opts for k in ks]}"


@QUICK
def test_beam_setting_through_the_engine(tiny_device, monkeypatch):
  """BEAM=2 as a user sets it (Context / env var): the realize path searches on the device and the result is right."""
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
  monkeypatch.setenv("PARALLEL", "0")
  a = data((6, 10), F32, seed=8)
  before = search_stats["timed"]
  with Context(BEAM=2):
    out = (Tensor(a, device=tiny_device) * 3 - 1).max(1).realize()
  assert search_stats["timed"] > before, "BEAM=2 did not time any kernel on the device"
  check(out, (a * 3 - 1).max(1), dt=F32, what="BEAM=2 through realize")


# *** explicit opt lists ***

U, R, L, G, GT, S = OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.SWAP
_LOCAL_OPS = (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP)

# kernel shapes: ew_reduce (12 | 32), matmul (8, 12 | 16), padded_conv (4, 8, 8 | 2, 3, 3), multi_axis_reduce (6 | 4, 8)
# (global axes | reduce axes); UNROLL and GROUP count their axis among the reduce axes
OPT_LISTS: Dict[str, Dict[str, List[Opt]]] = {
  "ew_reduce": {
    "upcast": [Opt(U, 0, 4)],
    "unroll": [Opt(R, 0, 8)],
    "upcast3_unroll4": [Opt(U, 0, 3), Opt(R, 0, 4)],
    "local": [Opt(L, 0, 4)],
    "group": [Opt(G, 0, 8)],
    "local_grouptop_upcast": [Opt(L, 0, 2), Opt(GT, 0, 16), Opt(U, 0, 2)],
  },
  "matmul": {
    "upcast_both": [Opt(U, 0, 4), Opt(U, 1, 3)],
    "upcast_unroll": [Opt(U, 1, 4), Opt(R, 0, 4)],
    "swap_upcast_unroll_all": [Opt(S, 0, 1), Opt(U, 0, 2), Opt(R, 0, 0)],
    "locals_upcast": [Opt(L, 0, 2), Opt(L, 1, 4), Opt(U, 0, 2)],
    "group_upcast": [Opt(G, 0, 4), Opt(U, 1, 3)],
    "local_grouptop_unroll": [Opt(L, 1, 2), Opt(GT, 0, 16)],
  },
  "padded_conv": {
    "upcast_unroll_kx": [Opt(U, 2, 4), Opt(R, 2, 0)],
    "upcast_cout_unroll_kernel": [Opt(U, 0, 4), Opt(R, 2, 0), Opt(R, 1, 0)],
    "swap_upcast": [Opt(S, 0, 2), Opt(U, 1, 2)],
    "locals_upcast": [Opt(L, 1, 4), Opt(L, 2, 2), Opt(U, 0, 2)],
    "group_local": [Opt(G, 0, 0), Opt(L, 2, 8)],
  },
  "multi_axis_reduce": {
    "unroll_inner_upcast": [Opt(R, 1, 4), Opt(U, 0, 2)],
    "unroll_both": [Opt(R, 1, 0), Opt(R, 0, 2)],
    "upcast_all": [Opt(U, 0, 0)],
    "group_local": [Opt(G, 1, 8), Opt(L, 0, 3)],
    "grouptop_unroll": [Opt(GT, 0, 4), Opt(R, 1, 4)],   # UNROLL's axis 0 is now the group axis: 1 is the next reduce axis
  },
}
OPT_CASES = [(p, n) for p in OPT_LISTS for n in OPT_LISTS[p]]


def _apply_list(opts: Sequence[Opt], device: str) -> Callable[[Kernel], Kernel]:
  def choose(k: Kernel) -> Kernel:
    for o in opts:
      try:
        k.apply_opt(o)
      except KernelOptError as e:
        if o.op in _LOCAL_OPS:
          # a device without local memory (or with less of it) cannot take this list: not a failure of the device
          pytest.skip(f"{o} does not apply on {device} ({type(k.opts).__name__}: has_local={k.opts.has_local}, "
                      f"has_shared={k.opts.has_shared}): {e}")
        raise AssertionError(f"kit bug: {o} of {list(opts)} does not apply to the kernel of shape {k.full_shape}: {e}") from e
    return k
  return choose


@pytest.mark.parametrize("program,name", quick_cases(OPT_CASES, lambda c: c in (("matmul", "upcast_unroll"), ("padded_conv", "upcast_unroll_kx"),
                                                                                   ("ew_reduce", "local_grouptop_upcast")),
                                                     ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_opt_list(program, name, tiny_device):
  opts = OPT_LISTS[program][name]
  ks = _run_program(program, tiny_device, _apply_list(opts, tiny_device), name)
  assert all(k.applied_opts == opts for k in ks), f"applied {[k.applied_opts for k in ks]}, expected {opts}"


# *** every single opt BEAM may try ***

@pytest.mark.parametrize("program", list(PROGRAMS))
def test_every_single_beam_action(program, tiny_device):
  """Each opt the BEAM search may apply first (an upcast, unroll, local, group, pad, swap of some axis and amount),
  alone on the kernel: all of them compute the same numbers."""
  build, want, tol = PROGRAMS[program]()
  renderer = Device[tiny_device].renderer
  sched = build(tiny_device).schedule()
  asts = [si.ast for si in sched if si.ast.op is MetaOps.KERNEL]
  assert len(asts) == 1, f"kit bug: {program} should be one kernel, it is {len(asts)}"
  actions = get_kernel_actions(Kernel(asts[0], opts=renderer).required_optimizations(), include_0=False)
  assert actions, f"no single opt applies to the {program} kernel on {tiny_device}"
  failures = []
  for k in actions.values():
    opt = k.applied_opts[-1]
    out = build(tiny_device)
    try:
      _kernels_and_run(out, tiny_device, lambda _k: _k.apply_opts(k.applied_opts))
      check(out, want, dt=F32, atol=tol, rtol=tol, what=f"{program} with {opt}")
    except Exception as e:   # a wrong result, or a kernel the device cannot compile or run
      failures.append(f"{opt}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
  assert not failures, f"{len(failures)} of {len(actions)} single opts give wrong results on {tiny_device}:\n" + "\n".join(failures)
