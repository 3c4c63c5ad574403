"""The bound-Variable (symbolic shape) workflow, end to end, eagerly and inside TinyJit.

tinygrad code writes variable-length work (a KV cache that grows by one token, a batch of changing length) with bound
Variables: a concrete tensor reshaped or shrunk to `Variable("i", lo, hi).bind(n)`, computed on, and read back. Every
test computes the same thing with numpy on the concrete values; the JIT tests also check that one capture (a fixed set
of compiled kernels) serves every value of the Variable.
"""
from __future__ import annotations

import numpy as np
import pytest

from tiny.engine import realize
from tiny.engine.jit import JitError, TinyJit
from tiny.helpers import GlobalCounters
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

MAX = 10


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
  return _softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])) @ v


# *** reshape concrete <-> symbolic, reading back ***

@pytest.mark.parametrize("n", [1, 4, 7])
def test_reshape_to_bound_variable_and_back(n: int) -> None:
  a = _rand(3, n)
  vi = Variable("i", 1, MAX).bind(n)
  t = Tensor(a).reshape(3, vi)
  # an equal Variable, not always the same object: views are cached, and bound Variables compare by value
  dim = t.shape[1]
  assert isinstance(dim, Variable) and dim == vi and dim.unbind() == (Variable("i", 1, MAX), n), "the shape keeps the bound Variable"
  np.testing.assert_allclose(t.reshape(3, n).numpy(), a)
  np.testing.assert_allclose((t * 2 + 1).reshape(3, n).numpy(), a * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("n", [2, 5])
def test_numpy_of_a_symbolic_shape_reads_the_bound_size(n: int) -> None:
  a = _rand(3, n)
  t = Tensor(a).reshape(3, Variable("i", 1, MAX).bind(n))
  out = (t.exp() - 1).numpy()
  assert out.shape == (3, n)
  np.testing.assert_allclose(out, np.exp(a) - 1, rtol=1e-5, atol=1e-6)
  assert t.tolist() == a.tolist()
  assert np.asarray(t.data()).shape == (3, n)


def test_numpy_of_an_unbound_variable_shape_is_refused() -> None:
  t = Tensor(_rand(3, 4)).reshape(3, Variable("i", 1, MAX).bind(4))
  unbound = Tensor(t.lazydata.reshape((3, Variable("i", 1, MAX))))
  with pytest.raises(RuntimeError, match="bound Variables"):
    unbound.numpy()


# *** shrink, slice, cat, pad ***

@pytest.mark.parametrize("n", [1, 5, 10])
def test_shrink_by_bound_variable(n: int) -> None:
  full = _rand(MAX, 3)
  x = Tensor(full).shrink(((0, Variable("i", 1, MAX).bind(n)), None))
  np.testing.assert_allclose(x.numpy(), full[:n])
  np.testing.assert_allclose((x + 1).sum(0).numpy(), (full[:n] + 1).sum(0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [0, 3, 9])
def test_slice_with_bound_variable(n: int) -> None:
  full = _rand(2, MAX, 4)
  sp = Variable("start_pos", 0, MAX - 1).bind(n)
  np.testing.assert_allclose(Tensor(full)[:, :sp + 1].numpy(), full[:, :n + 1])
  np.testing.assert_allclose(Tensor(full)[:, sp:sp + 1].numpy(), full[:, n:n + 1])
  np.testing.assert_allclose(Tensor(full)[:, 1:sp + 1].numpy(), full[:, 1:n + 1])


def test_slice_with_bound_variable_refusals() -> None:
  sp = Variable("start_pos", 0, 20).bind(12)
  with pytest.raises(IndexError, match="out of bounds"):
    Tensor(_rand(2, MAX))[:, :sp]
  with pytest.raises(IndexError, match="step 1"):
    Tensor(_rand(2, MAX))[:, :Variable("j", 1, MAX).bind(4):2]


@pytest.mark.parametrize("n", [1, 4, 9])
def test_kv_cache_cat_along_symbolic_axis(n: int) -> None:
  cache, new = _rand(2, MAX, 4), _rand(2, 1, 4, seed=1)
  sp = Variable("start_pos", 1, MAX - 1).bind(n)
  kv = Tensor(cache)[:, :sp].cat(Tensor(new), dim=1)
  assert str(kv.shape[1]) == str(sp + 1)
  want = np.concatenate([cache[:, :n], new], axis=1)
  np.testing.assert_allclose(kv.numpy(), want)
  np.testing.assert_allclose(kv.sum(1).numpy(), want.sum(1), rtol=1e-5, atol=1e-5)
  # both sides symbolic
  both = Tensor(cache)[:, :sp].cat(Tensor(cache)[:, :sp] * 2, dim=1)
  np.testing.assert_allclose(both.numpy(), np.concatenate([cache[:, :n], cache[:, :n] * 2], axis=1))


@pytest.mark.parametrize("n", [1, 6])
def test_pad_symbolic_axis_to_fixed_max(n: int) -> None:
  full = _rand(MAX, 3)
  vi = Variable("i", 1, MAX).bind(n)
  padded = Tensor(full).shrink(((0, vi), None)).pad(((0, MAX - vi), None))
  assert padded.shape == (MAX, 3)
  np.testing.assert_allclose(padded.numpy(), np.pad(full[:n], ((0, MAX - n), (0, 0))))
  np.testing.assert_allclose(Tensor(full)[:vi].pad(((0, MAX - vi), None), value=-1.0).numpy(),
                             np.pad(full[:n], ((0, MAX - n), (0, 0)), constant_values=-1.0))


# *** reductions over symbolic axes ***

@pytest.mark.parametrize("n", [2, 3, 8])
def test_reductions_over_symbolic_axis(n: int) -> None:
  a = _rand(3, n)
  t = Tensor(a).reshape(3, Variable("i", 1, MAX).bind(n))
  np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(t.max(1).numpy(), a.max(1))
  np.testing.assert_allclose(t.min(1).numpy(), a.min(1))
  np.testing.assert_allclose(t.mean(1).numpy(), a.mean(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.mean(1, keepdim=True).numpy(), a.mean(1, keepdims=True), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.var(1).numpy(), a.var(1, ddof=1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.var(1, correction=0).numpy(), a.var(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.std(1).numpy(), a.std(1, ddof=1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.softmax(1).numpy(), _softmax(a, 1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.log_softmax(1).numpy(), np.log(_softmax(a, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 6])
def test_full_reductions_of_a_symbolic_tensor(n: int) -> None:
  a = _rand(3, n)
  t = Tensor(a).reshape(3, Variable("i", 1, MAX).bind(n))
  np.testing.assert_allclose(t.sum().numpy(), a.sum(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(t.mean().numpy(), a.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.mean(0).numpy(), a.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(t.max().numpy(), a.max())
  np.testing.assert_allclose(t.var().numpy(), a.var(ddof=1), rtol=1e-4, atol=1e-6)


def test_mean_over_shrunk_symbolic_rows() -> None:
  full = _rand(MAX, 4)
  for n in (1, 4, 10):
    x = Tensor(full)[:Variable("i", 1, MAX).bind(n)]
    np.testing.assert_allclose(x.mean(0).numpy(), full[:n].mean(0), rtol=1e-5, atol=1e-6)


def test_from_node_values() -> None:
  vi = Variable("i", 1, MAX).bind(4)
  assert Tensor.from_node(vi * 3 + 2).numpy().item() == 14
  assert Tensor.from_node(vi).numpy().item() == 4
  assert Tensor.from_node(7).numpy().item() == 7
  np.testing.assert_allclose((Tensor([2.0, 4.0]) / (vi * 2)).numpy(), [0.25, 0.5])
  with pytest.raises(NotImplementedError, match="not supported"):
    Tensor.from_node(vi // 2)


# *** attention with a symbolic sequence length ***

@pytest.mark.parametrize("n", [1, 3, 8])
def test_attention_over_symbolic_sequence(n: int) -> None:
  q, k, v = _rand(2, 1, 8), _rand(2, n, 8, seed=1), _rand(2, n, 8, seed=2)
  s = Variable("s", 1, MAX).bind(n)
  K, V = Tensor(k).reshape(2, s, 8), Tensor(v).reshape(2, s, 8)
  scores = Tensor(q) @ K.transpose(1, 2) / np.sqrt(8)
  assert str(scores.shape[-1]) == str(s)
  np.testing.assert_allclose((scores.softmax(-1) @ V).numpy(), _attention(q, k, v), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(Tensor(q).scaled_dot_product_attention(K, V).numpy(), _attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_attention_over_kv_cache_with_new_token() -> None:
  kc, vc = _rand(2, MAX, 8, seed=3), _rand(2, MAX, 8, seed=4)
  for n in (1, 4, 9):
    q, kn, vn = _rand(2, 1, 8, seed=n), _rand(2, 1, 8, seed=n + 10), _rand(2, 1, 8, seed=n + 20)
    sp = Variable("start_pos", 1, MAX - 1).bind(n)
    K = Tensor(kc)[:, :sp].cat(Tensor(kn), dim=1)
    V = Tensor(vc)[:, :sp].cat(Tensor(vn), dim=1)
    want = _attention(q, np.concatenate([kc[:, :n], kn], 1), np.concatenate([vc[:, :n], vn], 1))
    np.testing.assert_allclose(Tensor(q).scaled_dot_product_attention(K, V).numpy(), want, rtol=1e-5, atol=1e-5)


# *** TinyJit: one capture for every value ***

def _jit_runs(fn: TinyJit, calls: list) -> list:
  """Run fn over calls (tuples of args); after the capture (call 2) the replay runs the same captured runners and no
  kernel is compiled any more."""
  outs = []
  captured: list = []
  for i, args in enumerate(calls):
    before = len(realize.method_cache)
    outs.append(fn(*args))
    if i == 1:
      captured = [ei.prg for ei in fn.jit_cache]
      assert captured, "the second call captures the kernels"
    if i >= 2:
      assert len(realize.method_cache) == before, f"call {i} compiled new kernels: the capture must serve every value"
      assert [ei.prg for ei in fn.jit_cache] == captured, f"call {i} captured again"
  assert fn.cnt == len(calls)
  return outs


def test_jit_symbolic_input_reduce() -> None:
  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (x * 2 + 1).sum(1).realize()

  ns = [3, 5, 7, 4, 6, 1]
  data = [_rand(2, n, seed=n) for n in ns]
  outs = _jit_runs(step, [(Tensor(d).reshape(2, Variable("n", 1, MAX).bind(n)),) for d, n in zip(data, ns)])
  for d, o in zip(data, outs):
    np.testing.assert_allclose(o.numpy(), (d * 2 + 1).sum(1), rtol=1e-5, atol=1e-5)
  assert step.jit_kernels >= 1


def test_jit_symbolic_output_shape_follows_the_call() -> None:
  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (x * 2 - x.mean(1, keepdim=True)).realize()

  ns = [3, 5, 7, 2, 9]
  data = [_rand(2, n, seed=n) for n in ns]
  outs = _jit_runs(step, [(Tensor(d).reshape(2, Variable("n", 1, MAX).bind(n)),) for d, n in zip(data, ns)])
  for d, n, o in zip(data, ns, outs):
    assert str(o.shape[1]) == str(Variable("n", 1, MAX).bind(n)), f"output shape {o.shape} is not this call's"
    np.testing.assert_allclose(o.numpy(), d * 2 - d.mean(1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o.reshape(2, n).numpy(), d * 2 - d.mean(1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_jit_bound_variable_argument_reshape_inside() -> None:
  """The full buffer goes in with a bound Variable; the function shrinks and reshapes to it inside."""
  @TinyJit
  def step(x: Tensor, n: Variable) -> Tensor:
    row = x.shrink(((0, n),)).reshape(1, n)
    return (row.softmax(1) * row.var(1, keepdim=True)).realize()

  full = _rand(MAX)
  ns = [3, 5, 7, 2, 8, 10]
  outs = _jit_runs(step, [(Tensor(full), Variable("n", 1, MAX).bind(n)) for n in ns])
  for n, o in zip(ns, outs):
    r = full[:n].reshape(1, n)
    want = _softmax(r, 1) * r.var(1, ddof=1, keepdims=True)
    np.testing.assert_allclose(o.numpy(), want, rtol=1e-5, atol=1e-6)


def test_jit_kv_cache_attention() -> None:
  """A decoding step: append the new token to the cache (a symbolic cat), attend over it; one capture for all positions."""
  kc, vc = _rand(2, MAX, 8, seed=3), _rand(2, MAX, 8, seed=4)
  K_cache, V_cache = Tensor(kc).realize(), Tensor(vc).realize()

  @TinyJit
  def step(q: Tensor, kn: Tensor, vn: Tensor, sp: Variable) -> Tensor:
    K = K_cache[:, :sp].cat(kn, dim=1)
    V = V_cache[:, :sp].cat(vn, dim=1)
    return q.scaled_dot_product_attention(K, V).realize()

  ns = [1, 3, 5, 8, 2, 9]
  calls, wants = [], []
  for n in ns:
    q, kn, vn = _rand(2, 1, 8, seed=n), _rand(2, 1, 8, seed=n + 10), _rand(2, 1, 8, seed=n + 20)
    calls.append((Tensor(q), Tensor(kn), Tensor(vn), Variable("start_pos", 1, MAX - 1).bind(n)))
    wants.append(_attention(q, np.concatenate([kc[:, :n], kn], 1), np.concatenate([vc[:, :n], vn], 1)))
  kernels_before = GlobalCounters.kernel_count
  outs = _jit_runs(step, calls)
  assert GlobalCounters.kernel_count > kernels_before
  for o, w in zip(outs, wants):
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-5)


def test_jit_concrete_input_of_changing_size_is_refused() -> None:
  """The replay runs no Python, so a size that only the function body turns into a Variable cannot reach the kernels."""
  @TinyJit
  def step(x: Tensor) -> Tensor:
    return (x.reshape(1, Variable("n", 1, MAX).bind(x.shape[0])) * 2).sum().realize()

  for n in (3, 4):
    d = _rand(n, seed=n)
    np.testing.assert_allclose(step(Tensor(d)).numpy(), (d * 2).sum(), rtol=1e-5)
  with pytest.raises(JitError, match="bound Variable"):
    step(Tensor(_rand(5)))


def test_jit_kv_cache_write_at_symbolic_position_then_attend() -> None:
  """The decoding step as tinygrad's llama writes it: assign the new key at start_pos, attend over cache[:, :start_pos+1]."""
  cache = Tensor.zeros(2, MAX, 4).contiguous().realize()
  ref = np.zeros((2, MAX, 4), np.float32)

  @TinyJit
  def step(q: Tensor, kn: Tensor, sp: Variable) -> Tensor:
    cache[:, sp:sp + 1].assign(kn).realize()
    return (q @ cache[:, :sp + 1].transpose(1, 2)).softmax(-1).realize()

  calls, wants = [], []
  for n in range(8):
    q, kn = _rand(2, 1, 4, seed=n), _rand(2, 1, 4, seed=n + 30)
    calls.append((Tensor(q), Tensor(kn), Variable("start_pos", 0, MAX - 1).bind(n)))
    ref[:, n:n + 1] = kn
    wants.append(_softmax(q @ ref[:, :n + 1].transpose(0, 2, 1)))
  outs = _jit_runs(step, calls)
  for n, (o, w) in enumerate(zip(outs, wants)):
    assert o.numpy().shape == (2, 1, n + 1)
    np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(cache.numpy(), ref)


def test_jit_merged_heads_kv_cache_attention() -> None:
  """GPT-2's decode layout: heads merged in a (k/v, position, heads * dim) cache, the filled rows shrunk to a Variable
  and split into heads with a reshape; the reshape keeps one view, so the kernels index the cache without dividing by
  the Variable. Checked against numpy for several lengths from one capture."""
  H, D, S = 3, 4, MAX
  kv = _rand(2, S, H * D, seed=7)
  cache = Tensor(kv).realize()

  @TinyJit
  def step(q: Tensor, n: Variable) -> Tensor:
    keys = cache.shrink((None, (0, n), None))
    k, v = (keys.shrink(((j, j + 1), None, None)).reshape(n, H, D).transpose(0, 1) for j in range(2))
    return q.scaled_dot_product_attention(k, v).realize()

  ns = [2, 5, 9, 3, 10]
  qs = [_rand(H, 1, D, seed=40 + n) for n in ns]
  outs = _jit_runs(step, [(Tensor(q), Variable("n", 1, S).bind(n)) for q, n in zip(qs, ns)])
  for q, n, o in zip(qs, ns, outs):
    k, v = (kv[j, :n].reshape(n, H, D).transpose(1, 0, 2) for j in range(2))
    np.testing.assert_allclose(o.numpy(), _attention(q, k, v), rtol=1e-5, atol=1e-5)
  # the attention kernels read the cache through one view each: no division by the Variable in their source
  srcs = [ei.prg.p.src for ei in step.jit_cache if hasattr(ei.prg, "p")]
  srcs += [ji.prg.p.src for ei in step.jit_cache for ji in getattr(ei.prg, "jit_cache", [])]
  assert srcs and not any("/n)" in s or "%n)" in s or "/n;" in s for s in srcs)
