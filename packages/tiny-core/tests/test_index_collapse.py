"""Gathers read one element: arange positions are computed in the kernel that reads them (MetaOps.ARANGE), and the
one-hot sum over positions folds to one read (the index-collapse rule of codegen)."""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import pytest

from tiny import Tensor, dtypes
from tiny.codegen.symbolic_rules import constant_folder
from tiny.codegen.uops import UOp, UOps, graph_rewrite
from tiny.engine.realize import get_kernel
from tiny.engine.schedule import create_schedule
from tiny.ops import BinaryOps, MetaOps, UnaryOps, exec_alu
from tiny.registry import Device
from tiny.shape.symbolic import Variable

I32 = dtypes.int32


def evaluate(u: UOp, env: Dict[str, int]) -> Any:
  """A scalar interpreter for the ALU graphs these tests build (leaves: CONST and DEFINE_VAR)."""
  if u.op is UOps.CONST:
    return u.arg
  if u.op is UOps.DEFINE_VAR:
    name = u.arg.expr[:-1]
    return env[name] - _OFFSET[name]
  if u.op is UOps.CAST:
    return exec_alu(UnaryOps.CAST, u.dtype, [evaluate(u.src[0], env)])
  assert u.op is UOps.ALU, u.op
  return exec_alu(u.arg, u.dtype, [evaluate(s, env) for s in u.src])


def var(name: str, lo: int, hi: int) -> UOp:
  """A value in [lo, hi]; evaluate() takes it as env[name] (Variables start at 0, so the uop is name + lo)."""
  _OFFSET[name] = lo
  v = UOp(UOps.DEFINE_VAR, I32, (), Variable(f"{name}_", 0, hi - lo))
  return v + lo if lo else v


_OFFSET: Dict[str, int] = {}


def rng(n: int) -> UOp:
  return UOp(UOps.RANGE, I32, (UOp.const(I32, 0), UOp.const(I32, n)), (1000, True))


def fold(u: UOp) -> UOp:
  out = graph_rewrite(UOp(UOps.SINK, None, (u,)), constant_folder).src[0]
  assert not any(x.op in (UOps.RANGE, UOps.REDUCE) for x in (out, *out.sparents)), "the sum over r should be gone"
  return out


def one_hot_sum(cond_form: str, n: int, e: UOp, f: Any) -> UOp:
  r = rng(n)
  zero = UOp.const(I32, 0)
  if cond_form == "eq":          # where(r == e, f(r), 0)
    val = r.ne(e).ne(True).where(f(r), zero)
  else:                          # where(e != r, 0, f(r))
    val = e.ne(r).where(zero, f(r))
  return UOp(UOps.REDUCE, I32, (val, r), BinaryOps.ADD)


@pytest.mark.parametrize("cond_form", ["eq", "ne"])
def test_one_hot_sum_reads_the_matching_element(cond_form: str) -> None:
  e = var("e", -20, 30)
  out = fold(one_hot_sum(cond_form, 10, e, lambda r: r * 3 + 7))
  for ev in range(-20, 31):
    assert evaluate(out, {"e": ev}) == (ev * 3 + 7 if 0 <= ev < 10 else 0), ev


def test_split_reduce_compares_an_offset_range() -> None:
  # a reduce split in chunks of 16 compares e with r + 16*g: chunk g holds e only when 16*g <= e < 16*g + 16
  e, g = var("e", -5, 80), var("g", 0, 4)
  r = rng(16)
  val = (r + g * 16).ne(e).ne(True).where(r * 2 + g, UOp.const(I32, 0))
  out = fold(UOp(UOps.REDUCE, I32, (val, r), BinaryOps.ADD))
  for ev in range(-5, 81):
    for gv in range(5):
      want = sum(rv * 2 + gv for rv in range(16) if rv + 16 * gv == ev)
      assert evaluate(out, {"e": ev, "g": gv}) == want, (ev, gv)


def test_other_conditions_are_kept_at_the_matching_element() -> None:
  e, h = var("e", -3, 12), var("h", 0, 8)
  r = rng(10)
  cond = r.ne(e).ne(True) & r.lt(h)
  out = fold(UOp(UOps.REDUCE, I32, (cond.where(r + 100, UOp.const(I32, 0)), r), BinaryOps.ADD))
  for ev in range(-3, 13):
    for hv in range(9):
      assert evaluate(out, {"e": ev, "h": hv}) == sum(rv + 100 for rv in range(10) if rv == ev and rv < hv)


@pytest.mark.parametrize("wide", [dtypes.int64, dtypes.uint32])
def test_a_position_widened_to_the_index_dtype(wide: Any) -> None:
  # an int64 (or uint32) index compares with the int32 position cast up; r - 3 wraps in uint32 and still matches e + 3
  e = var("e", 0, 20)
  r = rng(12)
  val = (r + (-3)).cast(wide).ne(e.cast(wide)).ne(True).where(r * 5, UOp.const(I32, 0))
  out = fold(UOp(UOps.REDUCE, I32, (val, r), BinaryOps.ADD))
  for ev in range(21):
    assert evaluate(out, {"e": ev}) == ((ev + 3) * 5 if ev + 3 < 12 else 0), ev


def test_a_max_or_a_multiple_of_r_is_left_alone() -> None:
  e = var("e", 0, 20)
  r = rng(10)
  for red in (UOp(UOps.REDUCE, I32, (r.ne(e).ne(True).where(r, UOp.const(I32, 0)), r), BinaryOps.MAX),
              UOp(UOps.REDUCE, I32, ((r * 2).ne(e).ne(True).where(r, UOp.const(I32, 0)), r), BinaryOps.ADD)):
    out = graph_rewrite(UOp(UOps.SINK, None, (red,)), constant_folder).src[0]
    assert any(x.op is UOps.RANGE for x in (out, *out.sparents))
    for ev in range(21):
      assert evaluate_sum(red, ev) == evaluate_sum(out, ev)


def evaluate_sum(u: UOp, ev: int) -> int:
  """Evaluate a graph that may hold one REDUCE over one RANGE by running the loop."""
  if u.op is UOps.REDUCE:
    r = u.src[1]
    vals = [evaluate_sum(_bind(u.src[0], r, i), ev) for i in range(r.src[1].arg)]
    return max(vals) if u.arg is BinaryOps.MAX else sum(vals)
  return evaluate(u, {"e": ev})


def _bind(u: UOp, r: UOp, i: int) -> UOp:
  from tiny.codegen.uops import graph_substitute
  return graph_substitute(u, {r: UOp.const(I32, i)})


# *** whole programs ***

def _kernels(t: Tensor) -> List[Any]:
  return [si for si in create_schedule([t.lazydata]) if si.ast.op is MetaOps.KERNEL]


def _loop_ends(si: Any) -> List[int]:
  k = get_kernel(Device[Device.DEFAULT].renderer, si.ast)
  uops = k.linearize().uops
  assert uops is not None
  return [u.src[1].arg for u in uops.uops if u.op is UOps.RANGE and u.src[1].op is UOps.CONST]


def test_embedding_gather_is_one_kernel_without_a_vocabulary_loop() -> None:
  vocab, dim = 50257, 16
  w = np.random.default_rng(0).standard_normal((vocab, dim)).astype(np.float32)
  idx = np.array([[0, 1, vocab - 1, 4242], [-1, -vocab, 7, 50000]], dtype=np.int32)
  ks = _kernels(Tensor(w)[Tensor(idx)])
  assert len(ks) == 1, "the gather should neither split its reduce nor give arange a kernel"
  assert all(end <= dim for end in _loop_ends(ks[0])), "the one-hot sum over the vocabulary should fold to one read"
  np.testing.assert_array_equal(Tensor(w)[Tensor(idx)].numpy(), w[idx])


@pytest.mark.parametrize("dtype,npdt", [(dtypes.int64, np.int64), (dtypes.int16, np.int16), (dtypes.uint8, np.uint8),
                                        (dtypes.uint32, np.uint32)])
def test_gather_with_other_index_dtypes(dtype: Any, npdt: Any) -> None:
  w = np.random.default_rng(1).standard_normal((40000, 3)).astype(np.float32)
  idx = np.array([0, 255, 17, 3], dtype=npdt) if npdt is np.uint8 else np.array([0, 39999, 123, 7], dtype=np.uint32) \
    if npdt is np.uint32 else np.array([0, -1, 39999 if npdt is np.int64 else 32767, -32000], dtype=npdt)
  ks = _kernels(Tensor(w)[Tensor(idx, dtype=dtype)])
  assert len(ks) == 1 and all(end <= 4 for end in _loop_ends(ks[0])), "only the 4 indices and 3 columns are loops"
  np.testing.assert_array_equal(Tensor(w)[Tensor(idx, dtype=dtype)].numpy(), w[idx])


def test_the_selected_axis_is_not_unrolled_or_grouped() -> None:
  from tiny.codegen.kernel import KernelOptError, Opt, OptOps
  w, idx = Tensor.rand(4096, 3).realize(), Tensor([5, 9], dtype=dtypes.int32).realize()
  (si,) = _kernels(w[idx])
  k = get_kernel(Device[Device.DEFAULT].renderer, si.ast).copy()
  k2 = k.copy()
  with pytest.raises(KernelOptError, match="unless unrolled"):
    k.apply_opt(Opt(OptOps.UNROLL, 0, 4))
  # a sum over an axis no position varies along is free to unroll
  (si2,) = _kernels(Tensor.rand(4096, 3).realize().sum(0))
  get_kernel(Device[Device.DEFAULT].renderer, si2.ast).copy().apply_opt(Opt(OptOps.UNROLL, 0, 4))
  assert k2.compared_positions


def test_out_of_range_tensor_indices_read_zero() -> None:
  w = np.random.default_rng(2).standard_normal((3000, 5)).astype(np.float32)
  out = Tensor(w)[Tensor([5, 3000, -3001, 10 ** 6, -(10 ** 6), 2999])].numpy()
  want = np.stack([w[5], np.zeros(5), np.zeros(5), np.zeros(5), np.zeros(5), w[2999]]).astype(np.float32)
  np.testing.assert_array_equal(out, want)


def test_out_of_range_index_on_the_python_device() -> None:
  # the emulator checks every address: the folded read must stay inside the buffer for any index
  w = np.arange(12, dtype=np.float32).reshape(4, 3)
  out = Tensor(w, device="PYTHON")[Tensor([1, 9, -7, 3], device="PYTHON")].numpy()
  np.testing.assert_array_equal(out, np.stack([w[1], np.zeros(3), np.zeros(3), w[3]]))


@pytest.mark.parametrize("rows", [[1, 3], [4, -5, 9]])
def test_small_gathers_with_vector_loads(rows: List[int]) -> None:
  # a folded read's address is a ternary (index in range ? index : start): the C renderers must keep it in parentheses
  # inside pointer arithmetic (`data+c?i:0` is `(data+c)?i:0`, a wild pointer)
  x = np.arange(20, dtype=np.float32).reshape(5, 4)
  want = np.stack([x[r] if -5 <= r < 5 else np.zeros(4, np.float32) for r in rows])
  np.testing.assert_array_equal(Tensor(x)[Tensor(rows)].numpy(), want)
  np.testing.assert_array_equal(Tensor(x.T.copy())[:, Tensor(rows)].numpy(), want.T)


def test_two_index_tensors_and_a_slice() -> None:
  x = np.random.default_rng(3).standard_normal((300, 7, 400)).astype(np.float32)
  i, j = np.array([[0, 299], [-1, 17]]), np.array([[399, 0], [5, -400]])
  np.testing.assert_array_equal(Tensor(x)[Tensor(i), 2:5, Tensor(j)].numpy(), x[i, 2:5, j])


def test_embedding_gradient_adds_up_repeated_rows() -> None:
  vocab, dim = 1000, 4
  w0 = np.random.default_rng(4).standard_normal((vocab, dim)).astype(np.float32)
  idx = np.array([3, 999, 3, 0, 3], dtype=np.int32)
  w = Tensor(w0, requires_grad=True)
  (w[Tensor(idx)] * Tensor(np.arange(5 * dim, dtype=np.float32).reshape(5, dim))).sum().backward()
  want = np.zeros_like(w0)
  np.add.at(want, idx, np.arange(5 * dim, dtype=np.float32).reshape(5, dim))
  assert w.grad is not None
  np.testing.assert_array_equal(w.grad.numpy(), want)


def test_arange_is_computed_where_it_is_read() -> None:
  x = Tensor(np.ones(1000, np.float32)).realize()
  assert len(_kernels(Tensor.arange(1000).cast(dtypes.float32) * x)) == 1
  np.testing.assert_array_equal((Tensor.arange(1000).cast(dtypes.float32) * x).numpy(), np.arange(1000, dtype=np.float32))
  # realized alone, it is stored by a kernel of its own
  assert Tensor.arange(6).lazydata.base.op is MetaOps.ARANGE and len(_kernels(Tensor.arange(6))) == 1
  a = Tensor.arange(3, 40, 6).realize()
  assert a.lazydata.base.realized is not None
  np.testing.assert_array_equal(a.numpy(), np.arange(3, 40, 6))


@pytest.mark.parametrize("args,dtype", [((0, 10), None), ((-7, 30, 4), dtypes.int8), ((5, -5, -0.5), dtypes.float16),
                                        ((0, 1, 0.1), dtypes.float32), ((1e9, 1e9 + 40, 3), dtypes.float64),
                                        ((2 ** 31 - 10, 2 ** 31 + 5), dtypes.int64), ((0, 300, 37), dtypes.bfloat16)])
def test_arange_values_match_numpy(args: Any, dtype: Any) -> None:
  got = Tensor.arange(*args, dtype=dtype) if dtype is not None else Tensor.arange(*args)
  want = np.arange(*args, dtype=np.float64 if isinstance(args[-1], float) or dtype is not None and dtypes.is_float(dtype) else np.int64)
  np.testing.assert_allclose(got.numpy().astype(np.float64), want.astype(np.float64), rtol=1e-2 if dtype in (dtypes.float16, dtypes.bfloat16) else 1e-6)
  assert got.shape == want.shape


def test_padded_and_flipped_arange() -> None:
  a = Tensor.arange(10).pad(((3, 2),)).flip(0)
  np.testing.assert_array_equal(a.numpy(), np.pad(np.arange(10), (3, 2))[::-1])
  b = Tensor.arange(12).reshape(3, 4).permute(1, 0).expand(2, 4, 3)
  np.testing.assert_array_equal(b.numpy(), np.broadcast_to(np.arange(12).reshape(3, 4).T, (2, 4, 3)))
