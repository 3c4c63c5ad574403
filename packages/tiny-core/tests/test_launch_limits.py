"""Launch limits: no Opt may give a kernel more threads per workgroup, or a bigger workgroup or grid dim, than its renderer allows."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import pytest

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.engine.search import get_kernel_actions
from tiny.helpers import prod
from tiny.runtime.ops_python import PythonRenderer
from tiny.tensor import Tensor


class SmallGPU(PythonRenderer):
  """A PYTHON renderer with the launch limits of a small GPU."""

  def __init__(self, local_max: Tuple[int, ...] = (8, 4, 2), threads: Optional[int] = 16, global_max: Tuple[int, ...] = (1 << 20,) * 3,
               emulate: Optional[str] = None) -> None:
    super().__init__(emulate)
    self.local_max, self.local_threads_max, self.global_max = local_max, threads, global_max


def _kernel(shape: Tuple[int, int], renderer: Any) -> Kernel:
  # a transposed operand keeps the two axes apart (a plain elementwise kernel would be one flat axis)
  out = Tensor.empty(*shape, device="PYTHON") + Tensor.empty(shape[1], shape[0], device="PYTHON").permute(1, 0)
  return Kernel(create_schedule([out.lazydata])[-1].ast, opts=renderer)


def _local_size(k: Kernel) -> Any:
  return k.to_program().launch_dims({})[1] or [1, 1, 1]


def test_each_local_dim_is_limited() -> None:
  k = _kernel((32, 32), SmallGPU())
  with pytest.raises(KernelOptError, match="local dim 0 is 16, the most is 8"):
    k.apply_opt(Opt(OptOps.LOCAL, 0, 16))
  assert k.local_dims == 0 and k.applied_opts == []   # a refused opt leaves the kernel as it was
  k.apply_opt(Opt(OptOps.LOCAL, 0, 8))
  with pytest.raises(KernelOptError, match="local dim 1 is 8, the most is 4"):
    k.apply_opt(Opt(OptOps.LOCAL, 1, 8))


def test_threads_per_workgroup_are_limited() -> None:
  # every dim fits, but 8 * 4 threads is more than the 16 a workgroup may have: the old check (local_max[0] * 1024) let it pass
  k = _kernel((32, 32), SmallGPU(local_max=(64, 64, 64), threads=16))
  k.apply_opt(Opt(OptOps.LOCAL, 0, 8))
  with pytest.raises(KernelOptError, match="32 threads per workgroup, the most is 16"):
    k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  k.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  assert prod(_local_size(k)) == 16


def test_grouped_reduce_counts_as_local() -> None:
  out = Tensor.empty(8, 64, device="PYTHON").sum(axis=1)
  k = Kernel(create_schedule([out.lazydata])[-1].ast, opts=SmallGPU(local_max=(64, 64, 64), threads=16))
  k.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  with pytest.raises(KernelOptError, match="threads per workgroup"):
    k.apply_opt(Opt(OptOps.GROUP, 0, 8))
  k.apply_opt(Opt(OptOps.GROUP, 0, 4))


def test_tensor_core_warp_counts() -> None:
  # METAL's simdgroup is 32 lanes: with at most 32 threads a workgroup there is no room for another local dim
  from tiny.codegen.kernel import Opt as O
  a, b = Tensor.empty(16, 16, dtype=dtypes.float, device="PYTHON"), Tensor.empty(16, 16, dtype=dtypes.float, device="PYTHON")
  k = Kernel(create_schedule([(a @ b).lazydata])[-1].ast, opts=SmallGPU(local_max=(32, 32, 32), threads=32, emulate="METAL"))
  k.apply_opt(O(OptOps.TC, 0, 0))
  with pytest.raises(KernelOptError, match="64 threads per workgroup"):
    k.apply_opt(O(OptOps.LOCAL, 0, 2))


def test_global_dims_are_limited() -> None:
  k = _kernel((60, 8), SmallGPU(local_max=(64, 64, 64), threads=None, global_max=(64, 64, 64)))
  # padding 60 up to 96 would need a grid dim of 96
  with pytest.raises(KernelOptError, match="global dim 1 is 96, the most is 64"):
    k.apply_opt(Opt(OptOps.PADTO, 0, 48))
  k.apply_opt(Opt(OptOps.PADTO, 0, 32))
  # a kernel that starts past a grid limit is not the opt's doing: opts that leave it (or fix it) still apply
  k2 = _kernel((128, 8), SmallGPU(local_max=(64, 64, 64), threads=None, global_max=(64, 64, 64)))
  assert list(k2.launch_limit_problems()) == [("global", 1)]
  k2.apply_opt(Opt(OptOps.UPCAST, 1, 2))
  k2.apply_opt(Opt(OptOps.LOCAL, 0, 2))
  assert k2.launch_limit_problems() == {}


def test_beam_actions_respect_the_limits() -> None:
  k = _kernel((64, 64), SmallGPU())
  acted = get_kernel_actions(k, include_0=False)
  assert acted, "some actions fit"
  locals_seen = set()
  for k2 in acted.values():
    assert k2.launch_limit_problems() == {}
    locals_seen |= {o.amt for o in k2.applied_opts if o.op is OptOps.LOCAL}
  assert locals_seen and max(locals_seen) <= 8
  for k2 in acted.values():
    for k3 in get_kernel_actions(k2, include_0=False).values():
      ls = _local_size(k3) if k3.local_dims else [1]
      assert prod(ls) <= 16 and all(s <= m for s, m in zip(ls, (8, 4, 2)))
