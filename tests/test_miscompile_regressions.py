"""Programs the kernel optimizer once got wrong, on every device that computes, under NOOPT and the default heuristic.

Each case is checked against numpy or torch, never against another tiny run, so a wrong kernel cannot pass by
agreeing with itself.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.helpers import Context
from tiny.ops import MetaOps
from tiny.registry import Device
from tiny.tensor import Tensor
from tiny.testing.program_fuzz import realize_with_opts

torch = pytest.importorskip("torch")

COMPUTE = [d for d in ("CLANG", "LLVM", "PYTHON") if d in Device.get_available_devices()]
OPT_MODES = {"noopt": {"NOOPT": 1}, "heuristic": {"NOOPT": 0}}


@pytest.fixture(params=COMPUTE)
def device(request: pytest.FixtureRequest) -> str:
  return str(request.param)


@pytest.mark.parametrize("mode", OPT_MODES)
def test_padded_add_after_unrolled_reduce(device: str, mode: str) -> None:
  """An unrolled reduce feeding an add with a padded (gated) load stored twice to one address, the second store
  dropping the padded operand: a.pad(...) + b.sum(2) gave 2 where 3 is right."""
  with Context(**OPT_MODES[mode]):
    a = Tensor.ones(4, 4, device=device).contiguous().realize()
    b = Tensor.ones(4, 5, 2, device=device).contiguous().realize()
    got = (a.pad(((0, 0), (1, 0))) + b.sum(2)).numpy()
  want = np.pad(np.ones((4, 4), np.float32), ((0, 0), (1, 0))) + np.ones((4, 5, 2), np.float32).sum(2)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", OPT_MODES)
@pytest.mark.parametrize("shape,axis", [((3, 6, 4), 2), ((2, 3, 8), 2), ((5, 4, 3), 1)])
def test_elementwise_with_reduce_axis_views(device: str, mode: str, shape: tuple, axis: int) -> None:
  """Elementwise operands of a reduce result (padded, flipped, broadcast) read with every unroll the optimizer picks."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal(shape).astype(np.float32)
  out_shape = tuple(s for i, s in enumerate(shape) if i != axis)
  y = rng.standard_normal(tuple(s - 1 for s in out_shape)).astype(np.float32)
  with Context(**OPT_MODES[mode]):
    tx, ty = Tensor(x, device=device), Tensor(y, device=device)
    got = (ty.pad(((1, 0), (0, 1))).flip(0) * 2 + tx.sum(axis) + tx.max(axis)).numpy()
  want = np.flip(np.pad(y, ((1, 0), (0, 1))), 0) * 2 + x.sum(axis) + x.max(axis)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", OPT_MODES)
def test_gather_plus_fancy_index_gradient(device: str, mode: str) -> None:
  """Both gradient terms of gather + fancy indexing reach t.grad (one of them was dropped by the same miscompile)."""
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  idx = [[0, 1], [2, 3], [4, 0], [1, 1]]
  with Context(**OPT_MODES[mode]):
    t = Tensor(x, device=device, requires_grad=True)
    (t.gather(1, Tensor(idx, device=device)).sum() + t[[0, 2], 1:4].sum()).backward()
    assert t.grad is not None
    got = t.grad.numpy()
  tt = torch.tensor(x, requires_grad=True)
  (tt.gather(1, torch.tensor(idx)).sum() + tt[[0, 2], 1:4].sum()).backward()
  np.testing.assert_array_equal(got, tt.grad.numpy())


def _with_opts(*opts: Opt) -> Callable[..., Kernel]:
  """A kernel chooser for realize_with_opts: each kernel gets those of opts that apply to it, in order."""
  def choose(ast: Any, renderer: Any) -> Kernel:
    k = Kernel(ast, opts=renderer)
    for o in opts:
      try:
        k.apply_opt(o)
      except KernelOptError:
        pass
    return k
  return choose


def test_vector_lanes_computed_from_each_other(device: str) -> None:
  """The second cumsum of x.cumsum(0).cumsum(0) sums a masked window; unrolled by 4 with its outputs upcast by 2, the
  rewrites CSE output lane 1 into lane 0 + x. The CPU vectorizer packed both lanes into one vector add whose operand
  held its own result: a cycle (RecursionError while rendering, found by the program fuzzer)."""
  x = (np.random.default_rng(1).integers(-8, 9, (4, 16)) * 0.25).astype(np.float32)
  out = Tensor(x, device=device).cumsum(0).cumsum(0).contiguous()
  kernels = realize_with_opts([out], _with_opts(Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 1, 2)))
  assert any(Opt(OptOps.UPCAST, 1, 2) in k.opts for k in kernels)
  np.testing.assert_array_equal(out.numpy(), np.cumsum(np.cumsum(x, 0), 0))


def test_noopt_and_heuristic_do_not_share_cached_kernels(device: str) -> None:
  """The method cache was keyed without NOOPT: whichever setting compiled an AST first was reused for the other, so
  the noopt/heuristic pairs in this file ran one kernel twice. Each setting must get its own kernel."""
  from tiny.engine.realize import get_runner
  from tiny.helpers import ansistrip
  a = Tensor.ones(64, 64, device=device).contiguous().realize()
  (si,) = [s for s in (a * 3).schedule() if s.ast.op is MetaOps.KERNEL]
  with Context(NOOPT=1):
    plain = get_runner(device, si.ast)
  with Context(NOOPT=0):
    tuned = get_runner(device, si.ast)
  with Context(NOOPT=1):
    assert get_runner(device, si.ast) is plain
  assert ansistrip(plain.p.name) == "E_4096", plain.p.name     # one loop, no opts
  assert ansistrip(tuned.p.name) != "E_4096", tuned.p.name     # the heuristic upcasts this one


def test_multi_output_reduce_group_that_reads_itself(device: str) -> None:
  """v8 = exp(a.sum(0)) * -1.5 and the gradient term exp(..) * dL/dv8 were put in one multi-output kernel with the
  reduce, but dL/dv8 reads sqrt(v8 * v8), an output of its own kernel that reads v8: the schedule had a cycle
  ("cycle detected in the schedule graph", found by the program fuzzer)."""
  x = np.array([[0.25], [-0.5], [0.75], [0.5]], np.float32)
  a = Tensor(x, device=device, requires_grad=True)
  v8 = a.sum(0).exp() * -1.5
  v11 = (v8 * v8).sqrt()
  v11.sum().backward()
  assert a.grad is not None
  outs = [t.contiguous() for t in (v11, v8, a.grad)]
  Tensor.realize(*outs)
  ta = torch.tensor(x, requires_grad=True)
  t8 = ta.sum(0).exp() * -1.5
  t11 = (t8 * t8).sqrt()
  t11.sum().backward()
  for got, want in zip(outs, (t11, t8, ta.grad)):
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-6)
