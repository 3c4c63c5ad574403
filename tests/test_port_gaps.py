"""Gaps that broke tinygrad programs ported by renaming the package, each checked against torch (CPU) or numpy.

Errors are the built-in classes torch raises (so ported `except` clauses match), list construction infers dtypes like
tinygrad, fancy/boolean indexing, einsum diagonals, interpolate, pooling with ceil_mode, sort/topk/scatter(_reduce) and
the gradients of pow and std/var at their edge cases all agree with torch.
"""
import itertools

import numpy as np
import pytest

from tiny import Tensor, dtypes
from tiny.engine.jit import JitError
from tiny.tensor import AxisError, DTypeError, ShapeError, TensorError

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _same(ours: Tensor, ref: "torch.Tensor", atol: float = 1e-5) -> None:
  got, want = ours.numpy(), ref.detach().numpy()
  assert got.shape == want.shape, (got.shape, want.shape)
  np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5, equal_nan=True)


# ***** 1. error classes match what torch raises *****

def test_error_class_hierarchy():
  assert issubclass(ShapeError, RuntimeError) and issubclass(ShapeError, TensorError) and issubclass(ShapeError, ValueError)
  assert issubclass(AxisError, IndexError) and issubclass(AxisError, ValueError)
  assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, RuntimeError) and issubclass(DTypeError, ValueError)
  assert issubclass(JitError, RuntimeError)


@pytest.mark.parametrize("op", [
  lambda m, x, y: x + m.ones(4),
  lambda m, x, y: x.reshape(4, 2),
  lambda m, x, y: x @ y,
  lambda m, x, y: m.cat([x, y], dim=0) if m is torch else x.cat(y, dim=0),
])
def test_shape_mismatch_is_runtime_error(op):
  for m in (torch, Tensor):
    x, y = m.ones(2, 3), m.ones(2, 5)
    with pytest.raises(RuntimeError):
      op(m, x, y)


@pytest.mark.parametrize("op", [
  lambda x: x.sum(5), lambda x: x.cumsum(5), lambda x: x.max(-3), lambda x: x.transpose(0, 5),
  lambda x: x[10], lambda x: x[:, 3], lambda x: x[[0, 4]], lambda x: x.unsqueeze(4),
])
def test_out_of_range_index_or_axis_is_index_error(op):
  with pytest.raises(IndexError):
    op(torch.ones(3, 3))
  with pytest.raises(IndexError):
    op(Tensor.ones(3, 3))


def test_axis_error_still_a_value_error():
  # code written against the old class (a ValueError) keeps working
  with pytest.raises(ValueError):
    Tensor.ones(2, 3).sum(axis=5)


@pytest.mark.parametrize("op", [lambda x: x & x, lambda x: x | x, lambda x: x ^ x])
def test_bitwise_on_floats_is_type_error(op):
  with pytest.raises(RuntimeError):   # what torch raises
    op(torch.ones(3))
  with pytest.raises(TypeError):
    op(Tensor.ones(3))
  with pytest.raises(RuntimeError):
    op(Tensor.ones(3))


@pytest.mark.parametrize("op", [
  lambda m: m.ones(2, dtype=m.bool if m is torch else dtypes.bool) - m.ones(2, dtype=m.bool if m is torch else dtypes.bool),
  lambda m: m.ones(3).gather(0, m.zeros(2)),
  lambda m: F.one_hot(m.ones(3)) if m is torch else m.ones(3).one_hot(4),
])
def test_dtype_misuse_is_type_and_runtime_error(op):
  with pytest.raises(RuntimeError):
    op(torch)
  with pytest.raises(RuntimeError):
    op(Tensor)
  with pytest.raises(TypeError):
    op(Tensor)


def test_bitcast_refused_like_torch():
  # 3 float32 are 12 bytes: no whole number of float64s
  with pytest.raises(RuntimeError):
    torch.ones(3).view(torch.float64)
  with pytest.raises(TypeError):
    Tensor.ones(3).bitcast(dtypes.float64)
  with pytest.raises(RuntimeError):
    Tensor.ones(3).bitcast(dtypes.float64)
  # where torch allows it, the bits agree
  a = np.array([1.5, -2.0, 3.25, 1e-3], dtype=np.float32)
  np.testing.assert_array_equal(Tensor(a).bitcast(dtypes.float16).numpy(), torch.tensor(a).view(torch.float16).numpy())
  np.testing.assert_array_equal(Tensor(a).bitcast(dtypes.int32).numpy(), torch.tensor(a).view(torch.int32).numpy())


# ***** 2. construction *****

def test_list_of_numpy_arrays():
  rows = [np.arange(3, dtype=np.float32), np.zeros(3, dtype=np.float32)]
  t = Tensor(rows)
  assert t.dtype == dtypes.default_float
  np.testing.assert_array_equal(t.numpy(), np.stack(rows))
  ints = Tensor([np.array([1, 2]), np.array([3, 4])])
  assert ints.dtype == dtypes.default_int
  np.testing.assert_array_equal(ints.numpy(), [[1, 2], [3, 4]])


@pytest.mark.parametrize("data,dtype", [
  ([1, 2.5], dtypes.default_float), ([[1, 2], [3, 4.0]], dtypes.default_float), ([True, False], dtypes.bool),
  ([True, 2], dtypes.default_int), ([1, 2], dtypes.default_int), ([np.float32(1), 2], dtypes.default_float),
  ([np.int64(3), 2], dtypes.default_int), ([np.True_, False], dtypes.bool),
])
def test_list_dtype_inference(data, dtype):
  t = Tensor(data)
  assert t.dtype == dtype
  np.testing.assert_array_equal(t.numpy(), np.array([np.asarray(v).tolist() for v in data]) if dtype != dtypes.bool else np.array(data))


@pytest.mark.parametrize("data", [[2 ** 33], [2 ** 31], [-2 ** 40, 1, 2], [[2 ** 40], [-(2 ** 62)]]])
def test_ints_past_int32_become_int64(data):
  t = Tensor(data)
  ref = torch.tensor(data)
  assert t.dtype == dtypes.int64 and ref.dtype == torch.int64
  np.testing.assert_array_equal(t.numpy(), ref.numpy())
  assert Tensor(2 ** 33).dtype == dtypes.int64 and Tensor(2 ** 33).item() == 2 ** 33
  assert Tensor([2 ** 31 - 1]).dtype == dtypes.default_int


@pytest.mark.parametrize("shape", [(4, 0), (-1, 4), (0,), (2, 0, 3), (0, 2, -1)])
def test_reshape_of_zero_size(shape):
  if -1 in shape and 0 in shape:
    with pytest.raises(RuntimeError):
      torch.empty(0, 4).reshape(*shape)
    with pytest.raises(RuntimeError):
      Tensor.empty(0, 4).reshape(*shape)
    return
  assert Tensor.empty(0, 4).reshape(*shape).shape == tuple(torch.empty(0, 4).reshape(*shape).shape)


def test_rand_bool_casts_uniform_floats():
  # documented: tinygrad 0.9 casts [0, 1) floats, so an element is False only for an exact 0.0 draw
  Tensor.manual_seed(3)
  b = Tensor.rand(4, 256, dtype=dtypes.bool)
  Tensor.manual_seed(3)
  f = Tensor.rand(4, 256, dtype=dtypes.float32)
  assert b.dtype == dtypes.bool and b.shape == (4, 256)
  np.testing.assert_array_equal(b.numpy(), f.numpy() != 0)
  with pytest.raises(TypeError):
    Tensor.rand(3, dtype=dtypes.int32)


# ***** 3. indexing *****

_A = np.arange(120).reshape(4, 5, 6)


@pytest.mark.parametrize("name,ix", [
  ("lists around a slice", lambda m: ([0, 1], slice(None), [2, 3])),
  ("tuple of lists", lambda m: ([0, 1], [1, 2])),
  ("tuple index in a tuple", lambda m: ((0, 3), slice(None), 1)),
  ("negative lists", lambda m: ([-1, 0], [-2, 1])),
  ("list and step slice", lambda m: ([0, 2], slice(None, None, 2))),
  ("step slice then list", lambda m: (slice(None), slice(1, None, 2), [5, 0, -1])),
  ("None then list", lambda m: (None, [0, 2])),
  ("lists split by a slice", lambda m: ([1, 3], slice(1, 4), [0, 5])),
  ("broadcast lists", lambda m: ([[0], [3]], slice(None), [1, 2, 4])),
  ("ellipsis and list", lambda m: (Ellipsis, [5, 0])),
])
def test_fancy_indexing(name, ix):
  got = Tensor(_A)[ix(Tensor)]
  want = torch.tensor(_A)[ix(torch)]
  assert got.shape == tuple(want.shape), name
  np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_list_of_0d_tensors_is_an_index_tensor():
  # numpy reads a list as one index array (torch >= 2.9 too; older torch read it as a tuple, with a deprecation warning)
  got = Tensor(_A)[[Tensor(0), Tensor(3), Tensor(-1)]]
  np.testing.assert_array_equal(got.numpy(), torch.tensor(_A)[torch.tensor([0, 3, -1])].numpy())
  np.testing.assert_array_equal(got.numpy(), _A[[0, 3, -1]])
  got2 = Tensor(_A)[:, [Tensor(1), 2]]
  np.testing.assert_array_equal(got2.numpy(), _A[:, [1, 2]])


@pytest.mark.parametrize("mask_of", [
  lambda a: a % 7 == 0,                      # the full shape
  lambda a: a.sum((1, 2)) > 1500,            # the leading dim
  lambda a: a[:, :, 0] % 4 == 0,             # the two leading dims
  lambda a: a > 1000,                        # nothing selected
])
@pytest.mark.parametrize("as_tensor", [True, False])
def test_boolean_mask(mask_of, as_tensor):
  mask = mask_of(_A)
  got = Tensor(_A)[Tensor(mask) if as_tensor else mask]
  want = torch.tensor(_A)[torch.tensor(mask)]
  assert got.shape == tuple(want.shape)
  np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_boolean_mask_in_other_positions():
  m1 = np.array([True, False, True, True, False])
  m2 = np.array([False, True, True, False, False, True])
  for ix in [(slice(None), m1), (Ellipsis, m2), (slice(None), m1, [0, 5, 1]), (1, slice(None), m2), (slice(None), m1.tolist())]:
    tix = tuple(torch.tensor(i) if isinstance(i, np.ndarray) else i for i in ix)
    got = Tensor(_A)[tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in ix)]
    want = torch.tensor(_A)[tix]
    assert got.shape == tuple(want.shape), ix
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_boolean_mask_shape_mismatch_is_index_error():
  with pytest.raises(IndexError):
    torch.tensor(_A)[torch.tensor([True, False])]
  with pytest.raises(IndexError):
    Tensor(_A)[Tensor([True, False])]


def test_boolean_mask_setitem_and_grad():
  a = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
  t, r = Tensor(a), torch.tensor(a)
  t[t > 0] = 0.0
  r[r > 0] = 0.0
  np.testing.assert_array_equal(t.numpy(), r.numpy())
  x, xr = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  mask = a < 0.3
  (x[Tensor(mask)] * 3).sum().backward()
  (xr[torch.tensor(mask)] * 3).sum().backward()
  _same(x.grad, xr.grad)


@pytest.mark.parametrize("formula,shapes", [
  ("ii->", [(4, 4)]), ("ii->i", [(4, 4)]), ("ii", [(3, 3)]), ("bii->bi", [(2, 3, 3)]), ("bii->b", [(2, 3, 3)]),
  ("iji->j", [(3, 2, 3)]), ("ii,ij->j", [(4, 4), (4, 2)]), ("iij,kk->jk", [(3, 3, 2), (2, 2)]), ("...ii->...i", [(2, 5, 3, 3)]),
])
def test_einsum_repeated_letter(formula, shapes):
  rng = np.random.default_rng(2)
  ops = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  _same(Tensor.einsum(formula, *[Tensor(o) for o in ops]), torch.einsum(formula, *[torch.tensor(o) for o in ops]))


def test_einsum_repeated_letter_grad_and_mismatch():
  a = np.random.default_rng(3).standard_normal((3, 3)).astype(np.float32)
  x, xr = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  Tensor.einsum("ii->", x).backward()
  torch.einsum("ii->", xr).backward()
  _same(x.grad, xr.grad)
  with pytest.raises(RuntimeError):
    Tensor.einsum("ii->i", Tensor.ones(2, 3))


@pytest.mark.parametrize("mode,align", [("linear", False), ("linear", True), ("nearest", False), ("nearest-exact", False)])
@pytest.mark.parametrize("size", [(10, 3), (5, 7), (3, 14), (1, 1), (9, 13)])
def test_interpolate_2d(mode, align, size):
  img = np.random.default_rng(4).standard_normal((2, 3, 5, 7)).astype(np.float32)
  kw = {"align_corners": align} if mode == "linear" else {}
  want = F.interpolate(torch.tensor(img), size=size, mode="bilinear" if mode == "linear" else mode, **kw)
  _same(Tensor(img).interpolate(size, mode=mode, align_corners=align), want)


@pytest.mark.parametrize("mode,align", [("linear", False), ("linear", True), ("nearest", False), ("nearest-exact", False)])
def test_interpolate_1d_3d_and_grad(mode, align):
  rng = np.random.default_rng(5)
  kw = {"align_corners": align} if mode == "linear" else {}
  sig = rng.standard_normal((2, 3, 6)).astype(np.float32)
  _same(Tensor(sig).interpolate((11,), mode=mode, align_corners=align), F.interpolate(torch.tensor(sig), size=(11,), mode=mode, **kw))
  vol = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
  want = F.interpolate(torch.tensor(vol), size=(5, 2, 7), mode="trilinear" if mode == "linear" else mode, **kw)
  _same(Tensor(vol).interpolate((5, 2, 7), mode=mode, align_corners=align), want)
  x, xr = Tensor(sig, requires_grad=True), torch.tensor(sig, requires_grad=True)
  (x.interpolate((9,), mode=mode, align_corners=align) * Tensor(np.arange(9, dtype=np.float32))).sum().backward()
  (F.interpolate(xr, size=(9,), mode=mode, **kw) * torch.arange(9, dtype=torch.float32)).sum().backward()
  _same(x.grad, xr.grad, atol=1e-4)


@pytest.mark.parametrize("mode,align", [("linear", False), ("linear", True), ("nearest", False), ("nearest-exact", False)])
@pytest.mark.parametrize("factor", [2, 0.5, 1.7, (1.5, 0.6), (3, 1)])
@pytest.mark.parametrize("recompute", [False, True])
def test_interpolate_scale_factor(mode, align, factor, recompute):
  img = np.random.default_rng(6).standard_normal((2, 3, 5, 7)).astype(np.float32)
  kw = {"align_corners": align} if mode == "linear" else {}
  want = F.interpolate(torch.tensor(img), scale_factor=factor, mode="bilinear" if mode == "linear" else mode,
                       recompute_scale_factor=recompute, **kw)
  got = Tensor(img).interpolate(scale_factor=factor, mode=mode, align_corners=align, recompute_scale_factor=recompute)
  assert got.shape == tuple(want.shape)
  _same(got, want)


def test_interpolate_int_size_and_bad_arguments():
  img = np.random.default_rng(7).standard_normal((1, 2, 4, 6)).astype(np.float32)
  _same(Tensor(img).interpolate(5, mode="nearest"), F.interpolate(torch.tensor(img), size=5, mode="nearest"))
  with pytest.raises(ValueError, match="exactly one"):
    Tensor(img).interpolate((5, 5), scale_factor=2)
  with pytest.raises(ValueError, match="exactly one"):
    Tensor(img).interpolate()
  with pytest.raises(ValueError, match="scale_factor"):
    Tensor(img).interpolate(scale_factor=-1.0)
  with pytest.raises(ShapeError, match="empty size"):
    Tensor(img).interpolate(scale_factor=0.1)


@pytest.mark.parametrize("k,s,p", [(k, s, p) for k, s, p in itertools.product([2, 3], [1, 2, 3], [0, 1]) if p <= k // 2])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_ceil_mode(k, s, p, ceil_mode, count_include_pad):
  a = np.random.default_rng(6).standard_normal((2, 3, 7, 6)).astype(np.float32)
  want = F.avg_pool2d(torch.tensor(a), k, s, p, ceil_mode=ceil_mode, count_include_pad=count_include_pad)
  _same(Tensor(a).avg_pool2d(k, s, padding=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad), want)


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 2, 1), (3, 3, 1), (2, 3, 0)])
def test_max_pool2d_ceil_mode_and_avg_grad(k, s, p):
  a = np.random.default_rng(7).standard_normal((1, 2, 7, 8)).astype(np.float32)
  _same(Tensor(a).max_pool2d(k, s, padding=p, ceil_mode=True), F.max_pool2d(torch.tensor(a), k, s, p, ceil_mode=True))
  x, xr = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  x.avg_pool2d(k, s, padding=p, ceil_mode=True, count_include_pad=False).sum().backward()
  F.avg_pool2d(xr, k, s, p, ceil_mode=True, count_include_pad=False).sum().backward()
  _same(x.grad, xr.grad)


_S = np.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3], [np.nan, 2, 2, -np.inf, np.inf, 0, -0.5, np.nan, 2, 7]], dtype=np.float32)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_matches_torch_stable(dim, descending):
  v, i = Tensor(_S).sort(dim, descending=descending)
  tv, ti = torch.tensor(_S).sort(dim=dim, descending=descending, stable=True)
  np.testing.assert_array_equal(v.numpy(), tv.numpy())
  np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_sort_ints_3d_and_grad():
  a = np.random.default_rng(8).integers(-5, 5, (3, 4, 6))
  for dim in range(3):
    v, i = Tensor(a).sort(dim)
    tv, ti = torch.tensor(a).sort(dim=dim, stable=True)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
  f = np.random.default_rng(9).standard_normal((3, 5)).astype(np.float32)
  x, xr = Tensor(f, requires_grad=True), torch.tensor(f, requires_grad=True)
  (x.sort(1)[0] * Tensor(np.arange(5, dtype=np.float32))).sum().backward()
  (xr.sort(1)[0] * torch.arange(5, dtype=torch.float32)).sum().backward()
  _same(x.grad, xr.grad)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_topk(k, largest, dim):
  a = np.random.default_rng(10).standard_normal((8, 9)).astype(np.float32)
  v, i = Tensor(a).topk(k, dim=dim, largest=largest)
  tv, ti = torch.tensor(a).topk(k, dim=dim, largest=largest)
  _same(v, tv)
  np.testing.assert_array_equal(i.numpy(), ti.numpy())   # distinct values: the indices are unique
  v2, i2 = Tensor(a).topk(k, dim, largest, sorted=False)
  np.testing.assert_array_equal(np.take_along_axis(a, i2.numpy(), dim), v2.numpy())
  with pytest.raises(IndexError):
    Tensor(a).topk(10, dim=1)


def test_topk_ties_and_grad():
  a = np.array([[1, 3, 3, 2, 3, 0]], dtype=np.float32)
  v, i = Tensor(a).topk(2)
  np.testing.assert_array_equal(v.numpy(), [[3, 3]])
  np.testing.assert_array_equal(np.take_along_axis(a, i.numpy(), 1), v.numpy())
  f = np.random.default_rng(11).standard_normal((4, 6)).astype(np.float32)
  x, xr = Tensor(f, requires_grad=True), torch.tensor(f, requires_grad=True)
  x.topk(3, dim=1)[0].sum().backward()
  xr.topk(3, dim=1)[0].sum().backward()
  _same(x.grad, xr.grad)


_X = np.random.default_rng(12).standard_normal((3, 5)).astype(np.float32)
_SRC = np.random.default_rng(13).standard_normal((4, 5)).astype(np.float32)
_IDX_UNIQUE = np.array([[0, 1, 2, 0, 1], [2, 0, 1, 1, 0]])
_IDX_DUP = np.random.default_rng(14).integers(0, 3, (4, 4))


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_matches_torch():
  _same(Tensor(_X).scatter(0, Tensor(_IDX_UNIQUE), Tensor(_SRC)), torch.tensor(_X).scatter(0, torch.tensor(_IDX_UNIQUE), torch.tensor(_SRC)))
  _same(Tensor(_X).scatter(1, Tensor(_IDX_DUP[:3]), 7.5), torch.tensor(_X).scatter(1, torch.tensor(_IDX_DUP[:3]), 7.5))
  # duplicates: the last write wins, as on torch's CPU
  _same(Tensor(_X).scatter(0, Tensor(_IDX_DUP), Tensor(_SRC)), torch.tensor(_X).scatter(0, torch.tensor(_IDX_DUP), torch.tensor(_SRC)))
  for red in ("add", "multiply"):
    want = torch.tensor(_X).scatter(0, torch.tensor(_IDX_DUP), torch.tensor(_SRC), reduce=red)
    _same(Tensor(_X).scatter(0, Tensor(_IDX_DUP), Tensor(_SRC), reduce=red), want)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_reduce_matches_torch(reduce, include_self, dim):
  idx = _IDX_DUP[:3] if dim == 1 else _IDX_DUP
  want = torch.tensor(_X).scatter_reduce(dim, torch.tensor(idx), torch.tensor(_SRC), reduce, include_self=include_self)
  _same(Tensor(_X).scatter_reduce(dim, Tensor(idx), Tensor(_SRC), reduce, include_self=include_self), want)
  xi = np.random.default_rng(15).integers(-9, 9, (3, 5))
  si = np.random.default_rng(16).integers(-9, 9, (4, 5))
  want_i = torch.tensor(xi).scatter_reduce(dim, torch.tensor(idx), torch.tensor(si), reduce, include_self=include_self)
  got_i = Tensor(xi).scatter_reduce(dim, Tensor(idx), Tensor(si), reduce, include_self=include_self)
  np.testing.assert_array_equal(got_i.numpy(), want_i.numpy())


def test_scatter_grads():
  x, xr = Tensor(_X, requires_grad=True), torch.tensor(_X, requires_grad=True)
  # src of index's shape: torch's backward refuses a bigger src
  s, sr = Tensor(_SRC[:, :4], requires_grad=True), torch.tensor(_SRC[:, :4], requires_grad=True)
  w = np.arange(15, dtype=np.float32).reshape(3, 5)
  (x.scatter_reduce(0, Tensor(_IDX_DUP), s, "sum") * Tensor(w)).sum().backward()
  (xr.scatter_reduce(0, torch.tensor(_IDX_DUP), sr, "sum") * torch.tensor(w)).sum().backward()
  _same(x.grad, xr.grad)
  _same(s.grad, sr.grad)


def test_scatter_errors():
  with pytest.raises(TypeError):
    Tensor(_X).scatter(0, Tensor(_IDX_UNIQUE.astype(np.float32)), Tensor(_SRC))
  with pytest.raises(RuntimeError):
    Tensor(_X).scatter(0, Tensor(_IDX_UNIQUE[0]), Tensor(_SRC))
  with pytest.raises(ValueError):
    Tensor(_X).scatter_reduce(0, Tensor(_IDX_UNIQUE), Tensor(_SRC), "median")


# ***** 4. gradients at the edges, against torch *****

_BASES = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0]


def _grad_check(fn, *vals):
  ts = [torch.tensor(v, requires_grad=True) for v in vals]
  fn(*ts).sum().backward()
  xs = [Tensor(np.array(v, dtype=np.float32), requires_grad=True) for v in vals]
  out = fn(*xs)
  out.sum().backward()
  _same(out, fn(*[t.detach() for t in ts]))
  for x, t in zip(xs, ts):
    _same(x.grad, t.grad, atol=1e-4)


@pytest.mark.parametrize("e", [0, 0.0, 1, 2, 3, 4, 0.5, 1.5, 2.5, -1, -2, -0.5, -1.5, 1.3])
def test_pow_constant_exponent_grad(e):
  _grad_check(lambda x: x ** e, _BASES)


def test_pow_tensor_exponent_grad():
  _grad_check(lambda x, y: x ** y, _BASES, [0.0, 1, 2, 0, 0.5, -1, 3, 1.5])
  _grad_check(lambda x, y: x ** y, _BASES, [2.0, 3, 0.5, 2, 1.5, 0.0, -2, 0])
  _grad_check(lambda x, y: x ** y, [0.0, 0, 0, 0, -1], [0.0, -1, 1, 2, 0])   # 0 ** 0 and friends
  _grad_check(lambda x, y: x.pow(y), [[1.0, 2.0], [0.0, -3.0]], [2.0, 0.0])   # broadcast exponent


@pytest.mark.parametrize("base", [2.0, 0.5, 0.0, -2.0])
def test_rpow_grad(base):
  _grad_check(lambda y: base ** y, [0.0, 1, -1, 2, 0.5])


@pytest.mark.parametrize("fn", ["var", "std"])
@pytest.mark.parametrize("correction", [0, 1, 2])
@pytest.mark.parametrize("shape,axis", [((3, 1), 1), ((3, 2), 1), ((1, 4), 0), ((2, 3), None), ((1,), 0)])
def test_var_std_grad(fn, correction, shape, axis):
  vals = np.array([1.0, 2.0, 2.0, 5.0, 1.0, -1.0], dtype=np.float32)[:int(np.prod(shape))].reshape(shape).tolist()
  with np.errstate(all="ignore"), __import__("warnings").catch_warnings():
    __import__("warnings").simplefilter("ignore")
    _grad_check(lambda x: getattr(x, fn)(axis, correction=correction) if isinstance(x, Tensor) else
                getattr(x, fn)(axis, correction=correction), vals)


def test_std_grad_zero_spread():
  # std == 0 (equal values): torch's derivative is 0 there, not the inf/NaN of sqrt's
  _grad_check(lambda x: x.std(1, correction=0), [[1.0, 1.0], [2.0, 3.0]])
  _grad_check(lambda x: x.std(1), [[1.0, 1.0], [2.0, 3.0]])
