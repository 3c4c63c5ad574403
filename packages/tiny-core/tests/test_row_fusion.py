"""Row kernels (engine/row_fusion.py): softmax, log_softmax and layernorm as one kernel that walks each row once per reduce.

Every result is checked against numpy or torch, with row fusion on and off, on odd sizes, padded, permuted and shrunk
inputs, other axes, half precision and backward; the schedule tests check when the fusion applies and when it must not."""
import numpy as np
import pytest

from tiny import Tensor
from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.uops import UOps
from tiny.dtype import dtypes
from tiny.engine.schedule import create_schedule
from tiny.helpers import Context
from tiny.ops import BufferOps, LazyOp, MemBuffer, MetaOps, ReduceOps
from tiny.registry import Device


def np_softmax(a, axis=-1):
  e = np.exp(a - a.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def np_layernorm(a, axis=-1, eps=1e-5):
  return (a - a.mean(axis, keepdims=True)) / np.sqrt(a.var(axis, keepdims=True) + eps)


def rnd(*shape, seed=0, scale=3.0):
  return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def kernels(t: Tensor):
  return [si for si in create_schedule([t.lazydata]) if si.ast.op is MetaOps.KERNEL]


def n_reduces(si):
  return len([op for op in si.ast.lazyops if op.op in ReduceOps])


OPS = {
  "softmax": (lambda t: t.softmax(-1), lambda a: np_softmax(a)),
  "log_softmax": (lambda t: t.log_softmax(-1), lambda a: np.log(np_softmax(a))),
  "layernorm": (lambda t: t.layernorm(-1), lambda a: np_layernorm(a)),
  "std": (lambda t: (t - t.mean(-1, keepdim=True)) / t.std(-1, keepdim=True), lambda a: (a - a.mean(-1, keepdims=True)) / a.std(-1, keepdims=True, ddof=1)),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 33), (2, 3, 17), (5, 256), (4, 1000)])
@pytest.mark.parametrize("fusion", [0, 1])
def test_row_ops_match_numpy(op, shape, fusion):
  if op == "std" and shape[-1] == 1:
    pytest.skip("std of one element is a division by zero")
  a = rnd(*shape)
  fn, ref = OPS[op]
  with Context(ROW_FUSION=fusion):
    x = Tensor(a).realize()
    ks = kernels(fn(x))
    out = fn(x).numpy()
  np.testing.assert_allclose(out, ref(a), atol=2e-5, rtol=2e-5)
  if shape[-1] == 1:
    return   # a reduce over one element is no reduce
  if fusion:
    assert len(ks) == 1 and n_reduces(ks[0]) == 2, "the statistics are inlined into one row kernel"
  else:
    assert len(ks) >= 2 and all(n_reduces(si) <= 1 for si in ks)


@pytest.mark.parametrize("device", ["CLANG", "LLVM", "PYTHON"])
def test_row_kernel_on_each_cpu_device(device):
  try:
    Device[device]
  except Exception as e:  # a device this machine cannot open
    pytest.skip(f"{device} unavailable: {e}")
  a = rnd(6, 40, seed=3)
  x = Tensor(a, device=device).realize()
  assert len(kernels(x.softmax(-1))) == 1
  np.testing.assert_allclose(x.softmax(-1).numpy(), np_softmax(a), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(x.layernorm(-1).numpy(), np_layernorm(a), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(x.log_softmax(-1).numpy(), np.log(np_softmax(a)), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("view", ["pad", "shrink", "permute", "expand_rows", "flip"])
def test_row_kernel_reads_views_of_its_input(view):
  a = rnd(9, 24, seed=1)
  x = Tensor(a).realize()
  t, ref = {
    "pad": (lambda: x.pad(((0, 0), (2, 3))), lambda: np.pad(a, ((0, 0), (2, 3)))),
    "shrink": (lambda: x.shrink(((1, 8), (3, 20))), lambda: a[1:8, 3:20]),
    "permute": (lambda: x.permute(1, 0), lambda: a.T),
    "expand_rows": (lambda: x[0:1].expand(5, 24), lambda: np.broadcast_to(a[0:1], (5, 24))),
    "flip": (lambda: x.flip(1), lambda: a[:, ::-1]),
  }[view]
  np.testing.assert_allclose(t().softmax(-1).numpy(), np_softmax(ref()), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(t().layernorm(-1).numpy(), np_layernorm(ref()), atol=1e-5, rtol=1e-4)


def test_padded_intermediate_is_not_fused_and_is_right():
  # the pad is on a computed value (exp of a padded tensor): it must not be pushed into the row loops
  a = rnd(4, 10, seed=2)
  x = Tensor(a).realize()
  y = (x.exp().pad(((0, 0), (1, 1))) + 1).softmax(-1)
  np.testing.assert_allclose(y.numpy(), np_softmax(np.pad(np.exp(a), ((0, 0), (1, 1))) + 1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, (0, 1), (1, 2), -1])
def test_other_axes(axis):
  a = rnd(4, 6, 10, seed=4)
  x = Tensor(a).realize()
  np.testing.assert_allclose(x.layernorm(axis).numpy(), np_layernorm(a, axis), atol=1e-5, rtol=1e-4)
  if isinstance(axis, int):
    np.testing.assert_allclose(x.softmax(axis).numpy(), np_softmax(a, axis), atol=1e-6, rtol=1e-5)
  if axis == -1:
    assert len(kernels(x.layernorm(axis))) == 1, "the last axis fuses"
  else:
    assert len(kernels(x.layernorm(axis))) > 1, "a reduce over other or several axes keeps its kernels"


@pytest.mark.parametrize("noopt", [0, 1])
def test_reduce_over_two_unmergeable_axes(noopt):
  # found by the program fuzzer: a sum over both axes of a strided view, broadcast back, needs two store loops
  b = np.random.default_rng(27).integers(-4, 5, (4, 8)).astype(np.int32)
  with Context(NOOPT=noopt):
    x = Tensor(b).realize()[::2]
    v = x.sum(axis=(0, 1), keepdim=True).maximum(x).cast(dtypes.int8)
    got = (v % v.maximum(1)).numpy()
  bv = b[::2]
  vv = np.maximum(bv.sum(keepdims=True), bv).astype(np.int8)
  np.testing.assert_array_equal(got, np.fmod(vv, np.maximum(vv, 1)))


def test_keepdim_false_statistics():
  a = rnd(5, 7, seed=5)
  x = Tensor(a).realize()
  m, s = x.max(1), x.sum(1)
  y = x - m.reshape(5, 1) + (x * 2).exp().sum(1).log().unsqueeze(1) * s.reshape(5, 1)
  ref = a - a.max(1, keepdims=True) + np.log(np.exp(a * 2).sum(1, keepdims=True)) * a.sum(1, keepdims=True)
  np.testing.assert_allclose(y.numpy(), ref, atol=1e-4, rtol=1e-5)


def test_half_and_int_rows():
  a = rnd(6, 50, seed=6, scale=1.0)
  x = Tensor(a.astype(np.float16)).realize()
  np.testing.assert_allclose(x.softmax(-1).numpy().astype(np.float32), np_softmax(a.astype(np.float16).astype(np.float32)), atol=2e-3, rtol=2e-2)
  b = np.random.default_rng(7).integers(-50, 50, (5, 9)).astype(np.int32)
  xi = Tensor(b).realize()

  def fn():
    return (xi - xi.max(1, keepdim=True)) * (xi * xi - xi.sum(1, keepdim=True)).sum(1, keepdim=True)
  assert len(kernels(fn())) == 1
  yi = fn()
  ref = (b - b.max(1, keepdims=True)) * (b * b - b.sum(1, keepdims=True)).sum(1, keepdims=True)
  np.testing.assert_array_equal(yi.numpy(), ref)


def test_big_row_keeps_its_kernels():
  x = Tensor(rnd(2, 70000, seed=8)).realize()
  assert all(n_reduces(si) <= 1 for si in kernels(x.softmax(-1)))


def test_backward_matches_torch():
  torch = pytest.importorskip("torch")
  a, w = rnd(6, 19, seed=9), rnd(6, 19, seed=10)
  for name, fn in (("softmax", lambda t: t.softmax(-1)), ("log_softmax", lambda t: t.log_softmax(-1)),
                   ("layernorm", lambda t: t.layernorm(-1))):
    x = Tensor(a, requires_grad=True)
    (fn(x) * Tensor(w)).sum().backward()
    tx = torch.tensor(a, requires_grad=True)
    tfn = {"softmax": lambda t: t.softmax(-1), "log_softmax": lambda t: t.log_softmax(-1),
           "layernorm": lambda t: torch.nn.functional.layer_norm(t, (19,), eps=1e-5)}[name]
    (tfn(tx) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-4, err_msg=name)


def test_statistic_that_is_an_output_keeps_its_buffer():
  a = rnd(5, 12, seed=11)
  x = Tensor(a).realize()
  m = x.max(1, keepdim=True)
  y = (x - m).exp()
  y = y / y.sum(1, keepdim=True)
  Tensor.realize(y, m)
  np.testing.assert_allclose(m.numpy(), a.max(1, keepdims=True))
  np.testing.assert_allclose(y.numpy(), np_softmax(a), atol=1e-6, rtol=1e-5)


def test_statistic_shared_by_two_outputs():
  a = rnd(5, 12, seed=12)
  x = Tensor(a).realize()
  m = x.max(1, keepdim=True)
  y1, y2 = (x - m).exp().sum(1, keepdim=True) * x, x - m * 2
  Tensor.realize(y1, y2)
  np.testing.assert_allclose(y1.numpy(), np.exp(a - a.max(1, keepdims=True)).sum(1, keepdims=True) * a, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(y2.numpy(), a - 2 * a.max(1, keepdims=True), atol=1e-6)


def test_softmax_then_matmul_and_assign():
  a, b = rnd(8, 16, seed=13), rnd(16, 4, seed=14)
  x, w = Tensor(a).realize(), Tensor(b).realize()
  out = (x.softmax(-1) @ w).numpy()
  np.testing.assert_allclose(out, np_softmax(a) @ b, atol=1e-5, rtol=1e-5)
  # the input is overwritten after the lazy softmax was made from it: torch semantics, the old values count
  t = Tensor(a).realize()
  y = t.softmax(-1)
  t.assign(Tensor(rnd(8, 16, seed=15)))
  np.testing.assert_allclose(y.numpy(), np_softmax(a), atol=1e-6, rtol=1e-5)


def test_schedule_cache_keyed_by_the_setting():
  x = Tensor(rnd(3, 8, seed=16)).realize()
  with Context(ROW_FUSION=1):
    n1 = len(kernels(x.softmax(-1)))
  with Context(ROW_FUSION=0):
    n0 = len(kernels(x.softmax(-1)))
  with Context(ROW_FUSION=1):
    n2 = len(kernels(x.softmax(-1)))
  assert n1 == n2 == 1 and n0 == 3


def test_near_identical_row_graphs_give_their_own_results():
  # same structure, different constants and reduce ops: the cached kernels must not mix them up
  a = rnd(4, 9, seed=17)
  x = Tensor(a).realize()
  r1 = (x - x.max(1, keepdim=True) * 2.0).exp().sum(1, keepdim=True) * x
  r2 = (x - x.max(1, keepdim=True) * 3.0).exp().sum(1, keepdim=True) * x
  r3 = (x - x.sum(1, keepdim=True) * 2.0).exp().sum(1, keepdim=True) * x
  np.testing.assert_allclose(r1.numpy(), np.exp(a - 2 * a.max(1, keepdims=True)).sum(1, keepdims=True) * a, rtol=1e-5)
  np.testing.assert_allclose(r2.numpy(), np.exp(a - 3 * a.max(1, keepdims=True)).sum(1, keepdims=True) * a, rtol=1e-5)
  np.testing.assert_allclose(r3.numpy(), np.exp(a - 2 * a.sum(1, keepdims=True)).sum(1, keepdims=True) * a, rtol=1e-5)


def _row_kernel(shape=(8, 64)):
  x = Tensor(rnd(*shape, seed=18)).realize()
  (si,) = kernels(x.softmax(-1))
  return Kernel(si.ast, opts=Device[Device.DEFAULT].renderer)


def test_row_kernel_refuses_group_and_pad():
  for opt in (Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.PADTO, 1, 128)):
    with pytest.raises(KernelOptError):
      _row_kernel().apply_opt(opt)


@pytest.mark.parametrize("opts", [[], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.UPCAST, 0, 2)],
                                  [Opt(OptOps.UPCAST, 0, 4)], [Opt(OptOps.UNROLL, 0, 32)]])
def test_row_kernel_each_reduce_once_per_row(opts):
  k = _row_kernel().apply_opts(opts)
  k.linearize()
  uops = k.uops.uops
  # one loop over the row for the max, one for the sum, one for the store: the max is not recomputed inside the sum's
  # loop or the store's
  assert len([u for u in uops if u.op is UOps.RANGE and u.arg[1]]) == 3
  assert len([u for u in uops if u.op is UOps.STORE]) >= 1


@pytest.mark.parametrize("opts", [[], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.UPCAST, 0, 2)],
                                  [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8)], [Opt(OptOps.UNROLL, 0, 32)],
                                  [Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.UNROLL, 0, 4)]])
def test_row_kernel_with_opts_runs_right(opts):
  from tiny.engine.realize import CompiledRunner
  from tiny.device import Buffer
  a = rnd(8, 64, seed=18)
  k = _row_kernel().apply_opts(opts)
  prg = CompiledRunner(k.to_program())
  dev = Device.DEFAULT
  out, inp = Buffer(dev, 8 * 64, dtypes.float32).allocate(), Buffer(dev, 8 * 64, dtypes.float32).allocate()
  inp.copyin(memoryview(a.tobytes()))
  prg([out, inp], {}, wait=True)
  got = np.frombuffer(out.as_buffer(), dtype=np.float32).reshape(8, 64)
  np.testing.assert_allclose(got, np_softmax(a), atol=1e-6, rtol=1e-5)


def test_held_statistic_keeps_its_value_after_an_assign():
  a, b = rnd(5, 3, seed=19), rnd(5, 3, seed=20)
  x = Tensor(a).realize()
  s = (x * 3).sum(1, keepdim=True)   # inlined in the row kernel below, so it is still lazy afterwards
  np.testing.assert_allclose((s + x).exp().numpy(), np.exp((a * 3).sum(1, keepdims=True) + a), rtol=1e-5)
  x.assign(Tensor(b)).realize()
  np.testing.assert_allclose(s.numpy(), (a * 3).sum(1, keepdims=True), rtol=1e-5)
  np.testing.assert_allclose(x.numpy(), b)


@pytest.mark.parametrize("op", ["softmax", "layernorm", "log_softmax"])
def test_row_kernel_gpu_style_lowering_on_the_emulator(op):
  # thread indices (SPECIAL) and local dims instead of loops: each thread walks its row; run by the PYTHON emulator
  from tiny.runtime.ops_python import PythonProgram, PythonRenderer
  a = rnd(6, 40, seed=21)
  fn, ref = OPS[op]
  x = Tensor(a, device="PYTHON").realize()
  (si,) = kernels(fn(x))
  k = Kernel(si.ast, opts=PythonRenderer(emulate="CUDA")).hand_coded_optimizations()
  assert k.local_dims > 0 and k.row_store
  prg = k.to_program()
  out = memoryview(bytearray(a.size * 4)).cast("B")
  gs, ls = prg.launch_dims({})
  PythonProgram(prg.name, prg.src.encode())(out, memoryview(a.tobytes()).cast("B"), global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)))
  np.testing.assert_allclose(np.frombuffer(out.tobytes(), np.float32).reshape(a.shape), ref(a), atol=2e-5, rtol=2e-5)


def test_row_kernel_renders_for_gpus():
  # row kernels are off for GPUs (row_kernels=False), but a row kernel AST must still render there
  cuda = pytest.importorskip("tiny_cuda.renderer")
  ptx = pytest.importorskip("tiny_cuda.ptx")
  x = Tensor(rnd(6, 40, seed=22), device="PYTHON").realize()
  (si,) = kernels(x.softmax(-1))
  for r in (cuda.CUDARenderer("sm_80"), ptx.PTXRenderer("sm_80")):
    assert not r.row_kernels
    src = Kernel(si.ast, opts=r).hand_coded_optimizations().to_program().src
    assert src.count("for (") == 3 if isinstance(r, cuda.CUDARenderer) else ".entry" in src   # max, sum, store loops


@pytest.mark.parametrize("fn, ref", [
  (lambda t: t.softmax(-1).cast(dtypes.float16), lambda a: np_softmax(a).astype(np.float16)),
  (lambda t: t.softmax(-1) * 2 + t.exp().sum(-1, keepdim=True), lambda a: np_softmax(a) * 2 + np.exp(a).sum(-1, keepdims=True)),
  (lambda t: (t - t.max(-1, keepdim=True)).exp() * (t - t.max(-1, keepdim=True)).exp().max(-1, keepdim=True),
   lambda a: np.exp(a - a.max(-1, keepdims=True)) * np.exp(a - a.max(-1, keepdims=True)).max(-1, keepdims=True)),
])
def test_row_statistics_reused_by_the_store(fn, ref):
  a = rnd(5, 48, seed=23, scale=1.0)
  x = Tensor(a).realize()
  assert len(kernels(fn(x))) == 1
  got = fn(x).numpy()
  np.testing.assert_allclose(got.astype(np.float32), ref(a).astype(np.float32), atol=2e-3 if got.dtype == np.float16 else 1e-5, rtol=1e-3)


def test_affine_layernorm_and_rmsnorm_are_row_kernels():
  torch = pytest.importorskip("torch")
  nn = pytest.importorskip("tiny_nn")
  a, w, b = rnd(3, 7, 48, seed=24), rnd(48, seed=25), rnd(48, seed=26)
  ln = nn.LayerNorm(48)
  ln.weight, ln.bias = Tensor(w).realize(), Tensor(b).realize()
  x = Tensor(a).realize()
  assert len(kernels(ln(x))) == 1
  ref = torch.nn.functional.layer_norm(torch.tensor(a), (48,), torch.tensor(w), torch.tensor(b), eps=ln.eps).numpy()
  np.testing.assert_allclose(ln(x).numpy(), ref, atol=1e-4, rtol=1e-4)
  rms = nn.RMSNorm(48)
  rms.weight = Tensor(w).realize()
  assert len(kernels(rms(x))) == 1
  ref = a / np.sqrt((a * a).mean(-1, keepdims=True) + rms.eps) * w
  np.testing.assert_allclose(rms(x).numpy(), ref, atol=1e-4, rtol=1e-4)


def _kept_values_ordered(uops) -> bool:
  """True when the kernel keeps a reduce's source in its output (an AFTER over the side store's loop) and every other
  LOAD or STORE of the output comes after that loop has ended."""
  (after,) = [u for u in uops if u.op is UOps.AFTER]
  out = next(u for u in uops if u.op is UOps.DEFINE_GLOBAL and u.arg[0] == 0)
  side = {s for s in after.src if s.op is UOps.STORE}
  end = max(i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] in after.src)
  rest = [i for i, u in enumerate(uops) if u.op in (UOps.LOAD, UOps.STORE) and u.src[0] is out and u not in side]
  return len(side) > 0 and len(rest) > 0 and end < min(rest)


@pytest.mark.parametrize("opts", [[], [Opt(OptOps.UNROLL, 0, 4)], [Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.UPCAST, 0, 2)],
                                  [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 8)]])
def test_softmax_keeps_exp_in_the_output_instead_of_computing_it_twice(opts):
  k = _row_kernel().apply_opts(opts)
  k.linearize()
  uops = k.uops.uops
  out = next(u for u in uops if u.op is UOps.DEFINE_GLOBAL and u.arg[0] == 0)
  # the sum's loop stores exp(x - max) into the output; the store loop loads it back and scales it by 1/sum: the exp's
  # polynomial (its EXP2 before the CPU rewrite, its int-float bitcast after) is in one loop only
  assert any(u.op is UOps.LOAD and u.src[0] is out for u in uops)
  assert _kept_values_ordered(uops)
  loops_with_exp, open_loops = set(), []
  for u in uops:
    if u.op is UOps.RANGE:
      open_loops.append(u)
    elif u.op is UOps.ENDRANGE:
      open_loops.pop()
    elif u.op is UOps.BITCAST:
      loops_with_exp.add(open_loops[-1])
  assert len(loops_with_exp) == 1


def _folded_where_program(device):
  a = np.array([0.25, 1.5, -1.0, -0.5, -0.25, 0.75, 0.25], dtype=np.float32)
  c = np.array([0.0, -1.75, 1.0, -1.75, 0.75, 0.5, 0.25], dtype=np.float32)
  x = Tensor(a, device=device)
  y = x.maximum(x.permute((0,)))
  v = (y * y + 0.5).sqrt()[::1].softmax(0)
  return Tensor(np.array([False]).reshape(()), device=device).where(v, Tensor(c, device=device)).contiguous(), c


@pytest.mark.parametrize("device", ["CLANG", "LLVM", "PYTHON"])
def test_a_store_that_folds_away_its_row_statistic(device):
  # found by the program fuzzer: where(False, softmax(x), c) folds to c after lowering, so the store loop no longer reads
  # the row's sum; the exp values the sum's loop keeps in the output must still land there before the store loop
  # (kernel without opts)
  from tiny.testing.program_fuzz import realize_with_opts
  out, c = _folded_where_program(device)
  (si,) = kernels(out)
  k = Kernel(si.ast, opts=Device[device].renderer)
  k.linearize()
  assert _kept_values_ordered(k.uops.uops)
  out, c = _folded_where_program(device)
  realize_with_opts([out], [[]])
  np.testing.assert_array_equal(out.numpy(), c)


def test_no_kept_values_in_an_output_the_kernel_reads():
  # an in-place softmax (the output is also an input): the sum's loop must not overwrite x, which the store loop reads
  from tiny.codegen.lowerer import _row_kept_value, row_store_axes
  x = Tensor(rnd(4, 32, seed=27)).realize()
  (si,) = kernels(x.softmax(-1))
  ast = si.ast
  assert _row_kept_value(ast, row_store_axes(ast), 2) is not None
  load = next(op for op in ast.lazyops if op.op is BufferOps.LOAD)
  in_place = _replace_lazyop(ast, load, LazyOp(BufferOps.LOAD, (), MemBuffer(0, load.arg.dtype, load.arg.st)))
  assert _row_kept_value(in_place, row_store_axes(in_place), 2) is None
  # (the scheduler makes no row kernel of an assign in place; its values are right either way)
  a = rnd(4, 32, seed=28)
  t = Tensor(a).realize()
  t.assign(t.softmax(-1)).realize()
  np.testing.assert_allclose(t.numpy(), np_softmax(a), atol=1e-6, rtol=1e-5)


def _replace_lazyop(x, old, new):
  return new if x is old else LazyOp(x.op, tuple(_replace_lazyop(s, old, new) for s in x.src), x.arg)


@pytest.mark.parametrize("view, kept", [((3, 1), True), ((1, 2), True), ("flip", True), ("broadcast", False), ("mask", False)])
def test_kept_values_need_an_address_of_their_own(view, kept):
  from tiny.codegen.lowerer import _injective
  from tiny.shape.view import View
  if view == "flip":
    v = View.create((2, 3), (3, -1), 2)
  elif view == "broadcast":
    v = View.create((2, 3), (1, 0))
  elif view == "mask":
    v = View.create((2, 3), (3, 1), 0, ((0, 2), (0, 2)))
  else:
    v = View.create((2, 3), view)
  assert _injective(v) is kept


def test_overlapping_strides_are_not_injective():
  from tiny.codegen.lowerer import _injective
  from tiny.shape.view import View
  assert not _injective(View.create((3, 3), (2, 1)))
  assert _injective(View.create((3, 3), (1, 3)))


def torch_ref(fn_name, scores_fn, *arrays):
  torch = pytest.importorskip("torch")
  return getattr(scores_fn(*[torch.tensor(a) for a in arrays]), fn_name)(-1).numpy()


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(1, 12, 128, 128, 64), (2, 3, 7, 13, 5), (1, 1, 33, 1000, 8)])
def test_softmax_of_masked_matmul_scores_is_matmul_then_one_row_kernel(fn, shape):
  # attention's scores: q @ k^T * scale + a causal mask broadcast over the heads; the row kernel reads the matmul's
  # output (with the scale and mask applied by the matmul kernel) instead of a max, a sum and an elementwise kernel
  B, H, T, S, D = shape
  q, k = rnd(B, H, T, D, seed=1), rnd(B, H, S, D, seed=2)
  mask = np.where(np.tril(np.ones((T, S), bool)), 0, -np.inf).astype(np.float32)
  mask[min(2, T - 1)] = -np.inf   # a row with no key: NaN, as torch
  kill = Tensor(np.where(np.arange(T) == min(2, T - 1), -np.inf, 0).astype(np.float32).reshape(T, 1)).realize()
  tq, tk = Tensor(q).realize(), Tensor(k).realize()
  scale = 1 / np.sqrt(D)

  def make():   # a fresh graph each time: a schedule that is made but not run must not be made again
    tmask = Tensor.ones(T, S).tril(0).cast(dtypes.bool).where(0, -float("inf")) + kill
    return getattr(tq @ tk.transpose(-2, -1) * scale + tmask, fn)(-1)
  ks = kernels(make())
  out = make()
  row = [si for si in ks if n_reduces(si) == 2]
  assert len(row) == 1 and len(ks) <= 3, [n_reduces(si) for si in ks]   # (the k^T copy), the matmul, the row kernel
  ref = torch_ref(fn, lambda a, b, m: a @ b.transpose(-2, -1) * scale + m, q, k, mask)
  np.testing.assert_allclose(out.numpy(), ref, atol=3e-5, rtol=3e-5, equal_nan=True)
  assert np.isnan(out.numpy()[..., min(2, T - 1), :]).all()


def test_attention_matches_torch_with_fused_scores():
  torch = pytest.importorskip("torch")
  q, k, v = rnd(2, 4, 24, 16, seed=4), rnd(2, 4, 24, 16, seed=5), rnd(2, 4, 24, 16, seed=6)
  out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True).numpy()
  ref = torch.nn.functional.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), is_causal=True).numpy()
  np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_backward_through_fused_matmul_scores(fn):
  torch = pytest.importorskip("torch")
  a, b, w = rnd(9, 6, seed=7), rnd(6, 40, seed=8), rnd(9, 40, seed=9)
  m = np.where(np.random.default_rng(10).random((9, 40)) < 0.3, -np.inf, 0).astype(np.float32)
  m[:, 0] = 0
  ta, tb = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True)
  (getattr((ta @ tb) * 0.5 + Tensor(m), fn)(-1).maximum(-1e30) * Tensor(w)).sum().backward()
  xa, xb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
  (getattr((xa @ xb) * 0.5 + torch.tensor(m), fn)(-1).clamp(min=-1e30) * torch.tensor(w)).sum().backward()
  np.testing.assert_allclose(ta.grad.numpy(), xa.grad.numpy(), atol=1e-3, rtol=1e-3)
  np.testing.assert_allclose(tb.grad.numpy(), xb.grad.numpy(), atol=1e-3, rtol=1e-3)


def test_matmul_read_by_a_row_kernel_and_by_others():
  # the scores are also an output, and also read by another op: every result right, whatever the kernels
  a, b = rnd(5, 7, seed=11), rnd(7, 30, seed=12)
  s = Tensor(a) @ Tensor(b)
  sm = (s * 2).softmax(-1)
  other = (s + 1).sum(-1)
  outs = Tensor.realize(sm, other, s)
  ref_s = a @ b
  np.testing.assert_allclose(outs[0].numpy() if isinstance(outs, (list, tuple)) else sm.numpy(), np_softmax(ref_s * 2), atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(sm.numpy(), np_softmax(ref_s * 2), atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(other.numpy(), (ref_s + 1).sum(-1), atol=1e-3, rtol=1e-4)
  np.testing.assert_allclose(s.numpy(), ref_s, atol=1e-4, rtol=1e-4)


def test_softmax_times_a_matmul_of_the_same_shape():
  # a reduce of other axes read directly by the row kernel's output (no statistic on its path)
  a, b, c = rnd(6, 5, seed=13), rnd(5, 50, seed=14), rnd(6, 50, seed=15)
  out = Tensor(c).softmax(-1) * (Tensor(a) @ Tensor(b))
  np.testing.assert_allclose(out.numpy(), np_softmax(c) * (a @ b), atol=1e-4, rtol=1e-4)
  out2 = (Tensor(c) + (Tensor(a) @ Tensor(b))).softmax(-1) * (Tensor(a) @ Tensor(b)).exp()
  np.testing.assert_allclose(out2.numpy(), np_softmax(c + a @ b) * np.exp(a @ b), atol=1e-4, rtol=1e-3)
