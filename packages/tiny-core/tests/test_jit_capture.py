"""TinyJit: capture, replay, symbolic shapes, errors. References are eager runs of the same functions and numpy."""
import numpy as np
import pytest

from tiny.engine import realize
from tiny.engine.jit import JitError, TinyJit
from tiny.dtype import dtypes
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor


def _train_setup(seed: int):
  rng = np.random.default_rng(seed)
  w1, w2 = rng.standard_normal((8, 16)).astype(np.float32) * 0.3, rng.standard_normal((16, 4)).astype(np.float32) * 0.3
  xs = [rng.standard_normal((5, 8)).astype(np.float32) for _ in range(5)]
  ys = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(5)]
  return w1, w2, xs, ys


def _step_fn(w1: Tensor, w2: Tensor):
  def step(x: Tensor, y: Tensor) -> Tensor:
    Tensor.training = True
    loss = ((x.matmul(w1).relu().matmul(w2) - y) ** 2).mean()
    loss.backward()
    for w in (w1, w2):
      w.assign(w.detach() - w.grad * 0.1)
      w.grad = None
    Tensor.realize(w1, w2)
    Tensor.training = False
    return loss.realize()
  return step


def test_jitted_training_matches_eager():
  w1n, w2n, xs, ys = _train_setup(0)
  eager = [Tensor(w1n.copy(), requires_grad=True), Tensor(w2n.copy(), requires_grad=True)]
  jitted = [Tensor(w1n.copy(), requires_grad=True), Tensor(w2n.copy(), requires_grad=True)]
  step_e, step_j = _step_fn(*eager), TinyJit(_step_fn(*jitted))
  for x, y in zip(xs, ys):
    le = step_e(Tensor(x), Tensor(y)).numpy()
    lj = step_j(Tensor(x), Tensor(y)).numpy()
    np.testing.assert_allclose(lj, le, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jitted[0].numpy(), eager[0].numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jitted[1].numpy(), eager[1].numpy(), rtol=1e-5, atol=1e-6)


def _kernel_names(items):
  """Names of the compiled kernels in a list of ExecItems, looking inside graph executors."""
  from tiny.engine.jit import GraphRunner
  from tiny.engine.realize import CompiledRunner
  names = []
  for ei in items:
    if isinstance(ei.prg, GraphRunner):
      names += _kernel_names(ei.prg.jit_cache)
    elif isinstance(ei.prg, CompiledRunner):
      names.append(ei.prg.p.name)
  return names


class _Recorder:
  def __init__(self):
    self.items = []

  def add(self, ei):
    self.items.append(ei)


def test_replay_launches_same_kernels_as_eager():
  a_np, b_np = np.arange(12, dtype=np.float32).reshape(3, 4), np.ones((3, 4), np.float32)

  def f(a: Tensor, b: Tensor) -> Tensor:
    return ((a + b) * 2).sum(axis=1).realize()

  # the kernels an eager call launches, recorded through the same hook the JIT captures with
  a0, b0 = Tensor(a_np).realize(), Tensor(b_np).realize()
  rec = _Recorder()
  realize.capturing.append(rec)
  try:
    f(a0, b0)
  finally:
    realize.capturing.clear()
  eager = _kernel_names(rec.items)
  assert eager, "the eager call launched no kernel"
  jf = TinyJit(f)
  for i in range(4):
    out = jf(Tensor(a_np + i), Tensor(b_np))
    np.testing.assert_allclose(out.numpy(), ((a_np + i + b_np) * 2).sum(axis=1))
  assert _kernel_names(jf.jit_cache) == eager


def test_outputs_do_not_alias_between_calls():
  jf = TinyJit(lambda a: (a * 3).realize())
  outs = [jf(Tensor([float(i), 1.0])) for i in range(4)]
  for i, o in enumerate(outs):
    np.testing.assert_allclose(o.numpy(), [3.0 * i, 3.0])


def test_discarded_outputs_are_reused_without_the_garbage_collector():
  """A replay's output buffer goes back to the allocator as soon as the caller drops it (no reference cycle holds it)."""
  import gc
  from tiny.registry import Device
  x = Tensor(np.arange(4096, dtype=np.float32)).realize()
  jf = TinyJit(lambda: (x * 2 + 1).realize())
  for _ in range(3):
    jf()
  alloc = Device[x.device].allocator
  gc.collect()
  gc.disable()
  try:
    before = alloc.allocs
    for _ in range(5):
      jf()
    after = alloc.allocs
  finally:
    gc.enable()
  assert after - before <= 1, f"{after - before} new allocations for 5 replays whose outputs were dropped"
  np.testing.assert_allclose(jf().numpy(), np.arange(4096, dtype=np.float32) * 2 + 1)


def test_wrong_shape_dtype_and_count_raise():
  jf = TinyJit(lambda a: (a + 1).realize())
  for _ in range(3):
    jf(Tensor.ones(4).contiguous().realize())
  with pytest.raises(JitError, match="shape"):
    jf(Tensor.ones(5).contiguous().realize())
  with pytest.raises(JitError, match="dtype"):
    jf(Tensor.ones(4, dtype=dtypes.int32).contiguous().realize())
  with pytest.raises(JitError, match="arguments"):
    jf(Tensor.ones(4).contiguous().realize(), b=Tensor.ones(4).contiguous().realize())


def test_symbolic_jit_compiles_once():
  vi = Variable("i", 1, 20)

  def f(a: Tensor) -> Tensor:
    return (a * 2 + 1).sum().realize()

  jf = TinyJit(f)
  base = np.arange(20, dtype=np.float32)
  full = Tensor(base).realize()
  before = None
  for n in range(1, 11):
    if n == 3:
      before = len(realize.method_cache)
    out = jf(full.shrink(((0, vi.bind(n)),)))
    np.testing.assert_allclose(out.numpy(), (base[:n] * 2 + 1).sum(), rtol=1e-6)
  assert len(realize.method_cache) == before, "replays with new variable values must not compile new kernels"


def test_reset_recaptures():
  jf = TinyJit(lambda a: (a - 1).realize())
  for _ in range(3):
    jf(Tensor([1.0, 2.0]))
  jf.reset()
  assert jf.jit_kernels == 0
  for _ in range(3):
    np.testing.assert_allclose(jf(Tensor([5.0, 6.0, 7.0])).numpy(), [4.0, 5.0, 6.0])


def test_returned_inputs_are_this_calls_inputs():
  """A jitted function that returns an input (or a view of one) returns the input of that call, not the captured one."""
  jf = TinyJit(lambda a: (a, a[1:], (a * 2).realize()))
  for i in range(4):
    an = np.arange(4, dtype=np.float32) + 10 * i
    a = Tensor(an)
    same, view, doubled = jf(a)
    np.testing.assert_array_equal(same.numpy(), an, err_msg=f"returned input, call {i + 1}")
    np.testing.assert_array_equal(view.numpy(), an[1:], err_msg=f"returned view of the input, call {i + 1}")
    np.testing.assert_array_equal(doubled.numpy(), an * 2, err_msg=f"computed output, call {i + 1}")
