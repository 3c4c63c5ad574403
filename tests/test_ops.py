"""Every Tensor op against torch (forward values and gradients) on Device.DEFAULT (select another with DEVICE=NAME).

Shapes include 0-size, 1-size and broadcast dimensions; dtype-specific ops run on the dtypes they support.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

from tiny.dtype import dtypes  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402
from tiny.testing.ops_helper import helper_test_exception, helper_test_op  # noqa: E402

UNARY_SHAPES = [(), (0,), (1,), (45, 65)]

# name, torch fxn, tiny fxn (None: same code), extra helper kwargs
UNARY = [
  ("neg", lambda x: -x, None, {}),
  ("relu", lambda x: x.relu(), None, {}),
  ("exp", lambda x: x.exp(), None, {}),
  ("exp2", lambda x: x.exp2(), None, {}),
  ("log", lambda x: x.log(), None, {"low": 0.1, "high": 3}),
  ("log2", lambda x: x.log2(), None, {"low": 0.1, "high": 3}),
  ("sqrt", lambda x: x.sqrt(), None, {"low": 0.1, "high": 3}),
  ("rsqrt", lambda x: x.rsqrt(), None, {"low": 0.1, "high": 3, "grad_atol": 1e-3}),
  ("reciprocal", lambda x: x.reciprocal(), None, {"low": 0.5, "high": 3}),
  ("sin", lambda x: x.sin(), None, {"atol": 1e-5}),
  ("cos", lambda x: x.cos(), None, {"atol": 1e-5}),
  ("tan", lambda x: x.tan(), None, {"low": -1, "high": 1, "atol": 1e-5}),
  ("asin", lambda x: x.asin(), None, {"low": -0.9, "high": 0.9, "atol": 1e-5, "grad_atol": 1e-3}),
  ("acos", lambda x: x.acos(), None, {"low": -0.9, "high": 0.9, "atol": 1e-5, "grad_atol": 1e-3}),
  ("atan", lambda x: x.atan(), None, {"atol": 1e-5, "grad_atol": 1e-3}),
  ("sigmoid", lambda x: x.sigmoid(), None, {}),
  ("tanh", lambda x: x.tanh(), None, {"atol": 1e-6}),
  ("sinh", lambda x: x.sinh(), None, {"atol": 1e-5}),
  ("cosh", lambda x: x.cosh(), None, {"atol": 1e-5}),
  ("asinh", lambda x: x.asinh(), None, {"atol": 1e-5}),
  ("acosh", lambda x: x.acosh(), None, {"low": 1.1, "high": 3, "atol": 1e-5, "grad_atol": 1e-3}),
  ("atanh", lambda x: x.atanh(), None, {"low": -0.9, "high": 0.9, "atol": 1e-5}),
  ("abs", lambda x: x.abs(), None, {}),
  ("sign", lambda x: x.sign(), None, {}),
  ("square", lambda x: x.square(), None, {}),
  ("trunc", lambda x: x.trunc(), None, {"forward_only": True}),
  ("floor", lambda x: x.floor(), None, {"forward_only": True}),
  ("ceil", lambda x: x.ceil(), None, {"forward_only": True}),
  ("round", lambda x: x.round(), None, {"forward_only": True}),
  ("clip", lambda x: x.clip(-0.8, 0.6), None, {}),
  ("elu", TF.elu, lambda x: x.elu(), {}),
  ("celu", lambda x: TF.celu(x, 0.7), lambda x: x.celu(0.7), {}),
  ("selu", torch.selu, lambda x: x.selu(), {"atol": 1e-4, "grad_atol": 1e-3}),
  ("silu", TF.silu, lambda x: x.silu(), {}),
  ("swish", TF.silu, lambda x: x.swish(), {}),
  ("relu6", TF.relu6, lambda x: x.relu6(), {"low": -8, "high": 8}),
  ("hardswish", TF.hardswish, lambda x: x.hardswish(), {"low": -5, "high": 5, "grad_atol": 1e-3}),
  ("hardtanh", TF.hardtanh, lambda x: x.hardtanh(), {}),
  ("gelu", lambda x: TF.gelu(x, approximate="tanh"), lambda x: x.gelu(), {"atol": 1e-5}),
  ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), lambda x: x.quick_gelu(), {}),
  ("leakyrelu", lambda x: TF.leaky_relu(x, 0.05), lambda x: x.leakyrelu(0.05), {}),
  ("mish", TF.mish, lambda x: x.mish(), {"atol": 1e-5}),
  ("softplus", TF.softplus, lambda x: x.softplus(), {"atol": 1e-5, "low": -30, "high": 30}),
  ("softsign", TF.softsign, lambda x: x.softsign(), {}),
  ("isinf", torch.isinf, lambda x: x.isinf(), {"forward_only": True}),
  ("isnan", torch.isnan, lambda x: x.isnan(), {"forward_only": True}),
  ("logical_not", torch.logical_not, lambda x: x.logical_not(), {"forward_only": True}),
  ("lerp", lambda x: x.lerp(x * 0 + 2, 0.3), lambda x: x.lerp(x * 0 + 2, 0.3), {}),
]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("name,tf,tt,kw", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, tf, tt, kw, shape):
  helper_test_op([shape], tf, tt, **kw)


def test_special_values():
  vals = [[-float("inf"), -2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.5, float("inf"), float("nan")]]
  for fxn in (lambda x: x.isinf(), lambda x: x.isnan(), lambda x: x.round(), lambda x: x.floor(), lambda x: x.ceil(), lambda x: x.trunc(),
              lambda x: x.abs(), lambda x: x.sigmoid(), lambda x: x.exp()):
    helper_test_op(None, fxn, vals=vals, forward_only=True)
  helper_test_op(None, lambda x: x.isinf(), lambda x: x.isinf(detect_negative=False), vals=[[float("inf"), 1.0]], forward_only=True)
  helper_test_op(None, lambda x: x.isinf() & (x < 0), lambda x: x.isinf(detect_positive=False), vals=[[float("-inf"), float("inf")]],
                 forward_only=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8])
def test_unary_int(dtype):
  vals = [np.array([0, 1, 2, 5, 100, 7, 3] + ([] if dtype == np.uint8 else [-1, -5, -100]), dtype=dtype)]
  signed = not np.issubdtype(dtype, np.unsignedinteger)
  for fxn in ((lambda x: -x) if signed else (lambda x: x + 1), lambda x: x.abs(), lambda x: x.sign(), lambda x: x.relu(), lambda x: x * x,
              lambda x: ~x):
    helper_test_op(None, fxn, vals=vals, forward_only=True)
  helper_test_op(None, lambda x: x.sqrt(), vals=[np.array([0, 1, 4, 9, 10], dtype=dtype)], forward_only=True)
  helper_test_op(None, lambda x: x.exp(), vals=[np.array([0, 1, 2, 3], dtype=dtype)], forward_only=True, atol=1e-4)


def test_unary_bool():
  vals = [[True, False, True]]
  helper_test_op(None, lambda x: x.logical_not(), vals=vals, forward_only=True)
  helper_test_op(None, lambda x: ~x, vals=vals, forward_only=True)


BINARY_SHAPES = [((45, 65), (45, 65)), ((45, 65), (1, 65)), ((45, 1), (1, 65)), ((), (45,)), ((0, 3), (1, 3)), ((3, 1, 4), (2, 1)), ((1,), ())]

BINARY = [
  ("add", lambda x, y: x + y, None, {}),
  ("sub", lambda x, y: x - y, None, {}),
  ("mul", lambda x, y: x * y, None, {}),
  ("div", lambda x, y: x / y, None, {"low": 0.5, "high": 2, "grad_atol": 1e-3}),
  ("pow", lambda x, y: x ** y, None, {"low": 0.5, "high": 2, "atol": 1e-5, "grad_atol": 1e-3}),
  ("maximum", torch.maximum, Tensor.maximum, {}),
  ("minimum", torch.minimum, Tensor.minimum, {}),
  ("lt", lambda x, y: x < y, None, {"forward_only": True}),
  ("gt", lambda x, y: x > y, None, {"forward_only": True}),
  ("le", lambda x, y: x <= y, None, {"forward_only": True}),
  ("ge", lambda x, y: x >= y, None, {"forward_only": True}),
  ("eq", lambda x, y: x == y, None, {"forward_only": True}),
  ("ne", lambda x, y: x != y, None, {"forward_only": True}),
  ("where", lambda x, y: torch.where(x > y, x, y), lambda x, y: (x > y).where(x, y), {}),
  ("floordiv", lambda x, y: x // y, None, {"low": 0.5, "high": 4, "forward_only": True}),
  ("mod", lambda x, y: torch.remainder(x, y), lambda x, y: x % y, {"low": 0.5, "high": 4, "forward_only": True, "atol": 1e-5}),
]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name,tf,tt,kw", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, tf, tt, kw, shapes):
  helper_test_op(list(shapes), tf, tt, **kw)


def test_binary_equal_values():
  # ties for max/min share the gradient in tiny; torch does too for maximum/minimum
  vals = [[1.0, 2.0, 3.0, 4.0], [1.0, 0.0, 3.0, 5.0]]
  helper_test_op(None, torch.maximum, Tensor.maximum, vals=vals)
  helper_test_op(None, torch.minimum, Tensor.minimum, vals=vals)
  helper_test_op(None, lambda x, y: x == y, vals=vals, forward_only=True)


SCALAR_OPS = [
  lambda x: x + 2, lambda x: 2 + x, lambda x: x - 3.5, lambda x: 3.5 - x, lambda x: x * 4, lambda x: 4 * x, lambda x: x / 3, lambda x: 3 / x,
  lambda x: x ** 2, lambda x: x ** 3, lambda x: x ** 0.5, lambda x: x ** 2.5, lambda x: x ** -1, lambda x: x ** 0, lambda x: x ** 1,
  lambda x: 2 ** x, lambda x: x < 1, lambda x: 1 < x, lambda x: x == 1.5, lambda x: x >= 0.25,
]


@pytest.mark.parametrize("fxn", SCALAR_OPS, ids=[f"scalar{i}" for i in range(len(SCALAR_OPS))])
def test_scalar_ops(fxn):
  helper_test_op([(45, 65)], fxn, low=0.5, high=3, atol=1e-5, grad_atol=1e-3, forward_only=fxn(torch.ones(1)).dtype == torch.bool)


def test_pow_negative_base():
  helper_test_op([(45,)], lambda x: x ** 3, low=-3, high=-0.5)
  helper_test_op([(45,)], lambda x: x ** 2, low=-3, high=3)
  helper_test_op(None, lambda x, y: x ** y, vals=[[-2.0, -2.0, -3.0, 0.0, 0.0, 2.0], [2.0, 3.0, 0.5, 0.0, 2.0, -1.0]], forward_only=True)
  helper_test_op(None, lambda x: 0 ** x, vals=[[0.0, 1.0, 2.0]], forward_only=True)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64])
def test_binary_int(dtype):
  # numpy's integer ops have C wraparound and Python floor-division semantics, like tiny
  a = np.array([5, 7, 100, 0, 3, 9, 12, 1], dtype=dtype)
  b = np.array([2, 3, 7, 5, 3, 4, 5, 1], dtype=dtype)
  if not np.issubdtype(dtype, np.unsignedinteger):
    a[[1, 3, 5]] *= -1
    b[[2, 5]] *= -1
  ta, tb = Tensor(a), Tensor(b)
  with np.errstate(over="ignore"):
    for name, tf, nf in (("add", lambda x, y: x + y, np.add), ("sub", lambda x, y: x - y, np.subtract), ("mul", lambda x, y: x * y, np.multiply),
                         ("floordiv", lambda x, y: x // y, np.floor_divide), ("mod", lambda x, y: x % y, np.mod),
                         ("and", lambda x, y: x & y, np.bitwise_and), ("or", lambda x, y: x | y, np.bitwise_or), ("xor", lambda x, y: x ^ y, np.bitwise_xor),
                         ("lt", lambda x, y: x < y, np.less), ("eq", lambda x, y: x == y, np.equal), ("max", Tensor.maximum, np.maximum),
                         ("min", Tensor.minimum, np.minimum)):
      out = tf(ta, tb)
      assert out.dtype == dtypes.from_np(nf(a, b).dtype), name
      np.testing.assert_equal(out.numpy(), nf(a, b), err_msg=name)
    np.testing.assert_allclose((ta / tb).numpy(), a / b, rtol=1e-6)
    np.testing.assert_equal((ta << 2).numpy(), a << 2)
    np.testing.assert_equal((ta >> 1).numpy(), a >> 1)
    np.testing.assert_equal(ta.idiv(tb).numpy(), np.trunc(a / b).astype(dtype))


def test_binary_bool():
  vals = [[True, False, True, False], [True, True, False, False]]
  for fxn in (lambda x, y: x & y, lambda x, y: x | y, lambda x, y: x ^ y, lambda x, y: x == y, lambda x, y: x != y):
    helper_test_op(None, fxn, vals=vals, forward_only=True)


def test_where_broadcast_and_scalars():
  helper_test_op([(3, 4), (1, 4), (3, 1)], lambda c, x, y: torch.where(c > 0, x, y), lambda c, x, y: (c > 0).where(x, y))
  helper_test_op([(3, 4)], lambda x: torch.where(x > 0, x, 2.0), lambda x: (x > 0).where(x, 2.0))
  helper_test_op([(3, 4)], lambda x: torch.where(x > 0, 1.5, x), lambda x: (x > 0).where(1.5, x))
  helper_test_op([(3, 4)], lambda x: torch.where(x > 0, 1.0, -1.0), lambda x: (x > 0).where(1.0, -1.0), forward_only=True)


@pytest.mark.parametrize("a,b", [
  (np.int32, np.float32), (np.int8, np.int16), (np.uint8, np.int8), (np.int32, np.int64), (np.bool_, np.int32), (np.float16, np.float32),
  (np.uint8, np.int32), (np.bool_, np.float16), (np.int64, np.float16), (np.uint8, np.float16),
])
def test_dtype_promotion_matches_torch(a, b):
  x, y = np.array([1, 0, 1]).astype(a), np.array([2, 1, 0]).astype(b)
  tres = (Tensor(x) + Tensor(y))
  rres = torch.tensor(x) + torch.tensor(y)
  assert str(rres.dtype).removeprefix("torch.") in (tres.dtype.name, {"half": "float16", "float": "float32", "char": "int8", "short": "int16",
                                                                      "int": "int32", "long": "int64", "unsigned char": "uint8",
                                                                      "unsigned short": "uint16", "unsigned int": "uint32"}.get(tres.dtype.name))
  np.testing.assert_allclose(tres.numpy().astype(np.float64), rres.numpy().astype(np.float64))


def test_python_scalar_promotion():
  assert (Tensor([1, 2]) + 1).dtype == dtypes.int32
  assert (Tensor([1, 2]) + 1.5).dtype == dtypes.default_float
  assert (Tensor([1.0], dtype=dtypes.float16) * 2).dtype == dtypes.float16
  assert (Tensor([True]) + 1).dtype == dtypes.int32
  assert (Tensor([True]) & True).dtype == dtypes.bool
  assert (Tensor([1, 2]) / 2).dtype == dtypes.default_float
  np.testing.assert_allclose((Tensor([1, 2]) / 2).numpy(), [0.5, 1.0])
  assert (Tensor([3], dtype=dtypes.uint8) + (-1)).numpy().tolist() == [2]


# ***** reductions *****

REDUCE_SHAPES = [(45, 3), (3, 4, 5), (1,), ()]
REDUCE_AXES = [None, 0, -1, (0, -1), "keep"]


def _reduce_args(shape, axis):
  if axis == "keep":
    return ({"dim": 0, "keepdim": True} if shape else {}), ({"axis": 0, "keepdim": True} if shape else {})
  if axis is None:
    return {}, {}
  if (not shape and axis != 0 and axis != -1) or (isinstance(axis, tuple) and len(shape) < 2):
    return None
  return {"dim": axis}, {"axis": axis}


REDUCES = [
  ("sum", "sum", {}), ("max", "amax", {}), ("min", "amin", {}), ("mean", "mean", {"atol": 1e-5}), ("prod", "prod", {"low": 0.5, "high": 1.5}),
  ("logsumexp", "logsumexp", {"atol": 1e-5}),
]


REDUCE_CASES = [(r, shape, axis) for r in REDUCES for shape in REDUCE_SHAPES for axis in REDUCE_AXES
                if _reduce_args(shape, axis) is not None and not (r[1] == "prod" and isinstance(axis, tuple))]


@pytest.mark.parametrize("red,shape,axis", REDUCE_CASES, ids=[f"{r[0]}-{s}-{a}" for r, s, a in REDUCE_CASES])
def test_reduce(red, shape, axis):
  tiny_name, torch_name, kw = red
  targs, tiargs = _reduce_args(shape, axis)
  if torch_name == "logsumexp" and "dim" not in targs:
    targs = {"dim": tuple(range(len(shape)))}
  kw = {"atol": 1e-5, **kw}
  helper_test_op([shape], lambda x: getattr(torch, torch_name)(x, **targs), lambda x: getattr(x, tiny_name)(**tiargs), **kw)


def test_reduce_multi_axis_prod():
  helper_test_op([(3, 4, 5)], lambda x: x.prod(2).prod(0), lambda x: x.prod((0, 2)), low=0.5, high=1.5)
  helper_test_op(None, lambda x: x.prod(), vals=[[[-2.0, 0.0, 3.0], [1.5, -1.0, 2.0]]])
  helper_test_op(None, lambda x: x.prod(1), vals=[[[-2.0, 4.0, 3.0], [1.5, -1.0, 2.0]]])


@pytest.mark.parametrize("fxn", ["sum", "mean", "prod", "any", "all"])
def test_reduce_zero_size(fxn):
  for shape, axis in (((0,), None), ((3, 0), 1), ((3, 0), 0), ((0, 4), -1)):
    x = np.zeros(shape, dtype=np.float32)
    tkw = {} if axis is None else {"dim": axis}
    kw = {} if axis is None else {"axis": axis}
    ref = getattr(torch, fxn)(torch.tensor(x), **tkw).numpy()
    np.testing.assert_allclose(getattr(Tensor(x), fxn)(**kw).numpy(), ref, equal_nan=True)


def test_max_min_zero_size_dims_kept():
  assert Tensor.zeros(0, 3).max(0).shape == (3,)
  assert Tensor.zeros(0, 3).sum(1).shape == (0,)


@pytest.mark.parametrize("shape", [(45, 3), (3, 4, 5), (10,)], ids=str)
def test_var_std(shape):
  for corr in (0, 1):
    helper_test_op([shape], lambda x: x.var(correction=corr), lambda x: x.var(correction=corr), atol=1e-5)
    helper_test_op([shape], lambda x: x.std(dim=0, correction=corr), lambda x: x.std(axis=0, correction=corr), atol=1e-5)
    helper_test_op([shape], lambda x: x.var(dim=-1, keepdim=True, correction=corr), lambda x: x.var(axis=-1, keepdim=True, correction=corr),
                   atol=1e-5)
  helper_test_op([shape], lambda x: torch.var_mean(x, dim=0)[0], lambda x: x.var_mean(axis=0)[0], atol=1e-5)
  helper_test_op([shape], lambda x: torch.std_mean(x, dim=0)[1], lambda x: x.std_mean(axis=0)[1], atol=1e-5)


@pytest.mark.parametrize("shape", [(45, 3), (3, 4, 5), (10,), (1,)], ids=str)
def test_argmax_argmin(shape):
  helper_test_op([shape], lambda x: x.argmax(), forward_only=True)
  helper_test_op([shape], lambda x: x.argmin(), forward_only=True)
  helper_test_op([shape], lambda x: x.argmax(dim=0), lambda x: x.argmax(axis=0), forward_only=True)
  helper_test_op([shape], lambda x: x.argmin(dim=-1, keepdim=True), lambda x: x.argmin(axis=-1, keepdim=True), forward_only=True)


def test_argmax_ties_first_index():
  helper_test_op(None, lambda x: x.argmax(dim=1), lambda x: x.argmax(axis=1), vals=[[[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]], forward_only=True)
  helper_test_op(None, lambda x: x.argmin(dim=1), lambda x: x.argmin(axis=1), vals=[[[1.0, 1.0, 3.0], [2.0, 0.0, 0.0]]], forward_only=True)
  helper_test_op(None, lambda x: x.argmax(), vals=[np.array([1, 9, 9, -3], dtype=np.int32)], forward_only=True)


def test_max_gradient_ties():
  # tiny splits the gradient evenly among tied maxima (torch.amax does the same)
  helper_test_op(None, lambda x: x.amax(dim=1), lambda x: x.max(axis=1), vals=[[[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]])


@pytest.mark.parametrize("shape,axis", [((20,), 0), ((5, 7), 1), ((5, 7), 0), ((3, 600), 1), ((1,), 0), ((0,), 0), ((4, 0), 1)], ids=str)
def test_cumsum(shape, axis):
  helper_test_op([shape], lambda x: x.cumsum(axis), lambda x: x.cumsum(axis), atol=1e-4, grad_atol=1e-3)


def test_cumsum_int():
  helper_test_op(None, lambda x: x.cumsum(0), vals=[np.arange(-5, 30, dtype=np.int32)], forward_only=True)


@pytest.mark.parametrize("shape", [(3, 4), (5,), (2, 0)], ids=str)
def test_any_all(shape):
  x = (np.random.default_rng(1).uniform(size=shape) > 0.6)
  for fn, kw in (("any", {}), ("all", {}), ("any", {"dim": -1}), ("all", {"dim": 0}), ("any", {"dim": 0, "keepdim": True})):
    tkw = {("axis" if k == "dim" else k): v for k, v in kw.items()}
    np.testing.assert_equal(getattr(Tensor(x), fn)(**tkw).numpy(), getattr(torch.tensor(x), fn)(**kw).numpy())
  xf = x.astype(np.float32) * 2.5
  np.testing.assert_equal(Tensor(xf).any().numpy(), torch.tensor(xf).any().numpy())


# ***** matmul / einsum *****

MATMUL_SHAPES = [
  ((45, 65), (65, 45)), ((65,), (65, 45)), ((45, 65), (65,)), ((65,), (65,)), ((2, 3, 4, 5), (5, 6)), ((3, 4, 5), (1, 5, 6)),
  ((4, 1, 3, 5), (2, 5, 3)), ((0, 5), (5, 3)), ((3, 0), (0, 4)), ((1, 1), (1, 1)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes):
  helper_test_op(list(shapes), lambda x, y: x @ y, atol=1e-4, grad_atol=1e-3)
  helper_test_op(list(shapes), lambda x, y: x.matmul(y), lambda x, y: x.dot(y), atol=1e-4, grad_atol=1e-3)


def test_matmul_int_and_mixed():
  a, b = np.arange(12, dtype=np.int32).reshape(3, 4), np.arange(8, dtype=np.int32).reshape(4, 2) - 3
  np.testing.assert_equal((Tensor(a) @ Tensor(b)).numpy(), a @ b)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b.astype(np.float32))).numpy(), a @ b)


def test_matmul_errors():
  with pytest.raises(ValueError):
    Tensor.ones(3, 4) @ Tensor.ones(5, 4)
  with pytest.raises(ValueError):
    Tensor.ones(3) @ Tensor(2.0)


@pytest.mark.parametrize("formula,shapes", [
  ("ij,jk->ik", [(3, 4), (4, 5)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
  ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij,kj", [(3, 4), (5, 4)]), ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
  ("abc,cd,de->abe", [(2, 3, 4), (4, 5), (5, 2)]), ("ij", [(3, 4)]), ("i...->...", [(3, 4, 2)]),
], ids=str)
def test_einsum(formula, shapes):
  helper_test_op(shapes, lambda *xs: torch.einsum(formula, *xs), lambda *xs: Tensor.einsum(formula, *xs), atol=1e-4, grad_atol=1e-3)


# ***** conv and pooling *****

CONV_CASES = [
  # (bs, cin, H, W), (cout, cin/groups, kh, kw), kwargs
  ((2, 3, 9, 9), (4, 3, 3, 3), {}),
  ((2, 3, 9, 9), (4, 3, 3, 3), {"padding": 1}),
  ((1, 4, 10, 8), (6, 2, 3, 2), {"groups": 2, "stride": 2}),
  ((2, 2, 11, 11), (3, 2, 3, 3), {"dilation": 2, "padding": (1, 2)}),
  ((1, 1, 5, 5), (1, 1, 1, 1), {}),
  ((1, 3, 7, 7), (2, 3, 5, 5), {"stride": (2, 1), "padding": 2}),
  ((1, 6, 6, 6), (6, 1, 3, 3), {"groups": 6}),
  # stride 1, one group: the direct backward of function.Conv (asymmetric padding, rectangular kernel, padding = k-1)
  ((2, 3, 10, 9), (4, 3, 3, 5), {"padding": (1, 2)}),
  ((2, 4, 12, 12), (5, 4, 5, 5), {"padding": 4}),
  ((1, 2, 6, 6), (3, 2, 3, 3), {"padding": 3}),   # padding past k-1: the composed path
]


@pytest.mark.parametrize("xs,ws,kw", CONV_CASES, ids=str)
def test_conv2d(xs, ws, kw):
  helper_test_op([xs, ws, (ws[0],)], lambda x, w, b: TF.conv2d(x, w, b, **kw), lambda x, w, b: x.conv2d(w, b, **kw), atol=1e-4, grad_atol=1e-3)


def test_conv1d_and_conv3d():
  helper_test_op([(2, 3, 12), (4, 3, 3)], lambda x, w: TF.conv1d(x, w, padding=1, stride=2), lambda x, w: x.conv2d(w, padding=1, stride=2),
                 atol=1e-4, grad_atol=1e-3)
  helper_test_op([(1, 2, 5, 5, 5), (3, 2, 2, 3, 2)], lambda x, w: TF.conv3d(x, w), lambda x, w: x.conv2d(w), atol=1e-4, grad_atol=1e-3)


def test_conv2d_bad_shapes():
  with pytest.raises(ValueError):
    Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 4, 3, 3))
  with pytest.raises(ValueError):
    Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 3, 3))


@pytest.mark.parametrize("xs,ws,kw", [
  ((2, 4, 5, 5), (4, 3, 3, 3), {}),
  ((1, 4, 5, 6), (4, 2, 3, 3), {"stride": 2}),
  ((1, 4, 5, 5), (4, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
  ((1, 4, 5, 5), (4, 1, 3, 3), {"groups": 2, "dilation": 2}),
  ((1, 2, 6, 6), (2, 3, 2, 2), {"stride": (2, 3), "padding": (0, 1)}),
], ids=str)
def test_conv_transpose2d(xs, ws, kw):
  helper_test_op([xs, ws], lambda x, w: TF.conv_transpose2d(x, w, **kw), lambda x, w: x.conv_transpose2d(w, **kw), atol=1e-4, grad_atol=1e-3)


@pytest.mark.parametrize("shape,kw", [
  ((2, 3, 8, 8), {"kernel_size": 2}), ((1, 2, 9, 7), {"kernel_size": 3, "stride": 2}), ((1, 1, 8, 8), {"kernel_size": (2, 3), "stride": 1}),
  ((1, 2, 7, 7), {"kernel_size": 3, "padding": 1}), ((1, 1, 9, 9), {"kernel_size": 2, "stride": 3}),
], ids=str)
def test_pools(shape, kw):
  helper_test_op([shape], lambda x: TF.avg_pool2d(x, **kw), lambda x: x.avg_pool2d(**kw), atol=1e-5)
  helper_test_op([shape], lambda x: TF.max_pool2d(x, **kw), lambda x: x.max_pool2d(**kw), atol=1e-5)


def test_pool_dilation_and_count_include_pad():
  helper_test_op([(1, 2, 9, 9)], lambda x: TF.max_pool2d(x, kernel_size=3, dilation=2), lambda x: x.max_pool2d(kernel_size=3, dilation=2))
  helper_test_op([(1, 2, 7, 7)], lambda x: TF.avg_pool2d(x, 3, padding=1, count_include_pad=False),
                 lambda x: x.avg_pool2d(3, padding=1, count_include_pad=False), atol=1e-5)


# ***** normalization, attention, losses *****

@pytest.mark.parametrize("shape,axis", [((45, 65), -1), ((3, 4, 5), 1), ((10,), 0), ((3, 0), 0), ((1, 1), -1)], ids=str)
def test_softmax(shape, axis):
  helper_test_op([shape], lambda x: x.softmax(axis), lambda x: x.softmax(axis), atol=1e-6, grad_atol=1e-4)
  helper_test_op([shape], lambda x: x.log_softmax(axis), lambda x: x.log_softmax(axis), atol=1e-5, grad_atol=1e-4)


def test_softmax_large_values():
  helper_test_op([(3, 10)], lambda x: (x * 1000).softmax(-1), forward_only=True)
  helper_test_op([(3, 10)], lambda x: (x * 1000).log_softmax(-1), forward_only=True, atol=1e-3)


def test_layernorm_batchnorm():
  helper_test_op([(4, 5, 6)], lambda x: TF.layer_norm(x, (6,), eps=1e-5), lambda x: x.layernorm(eps=1e-5), atol=1e-5, grad_atol=1e-3)
  helper_test_op([(4, 5, 6)], lambda x: TF.layer_norm(x, (5, 6)), lambda x: x.layernorm(axis=(1, 2)), atol=1e-5, grad_atol=1e-3)
  helper_test_op([(4, 3, 5, 5), (3,), (3,), (3,), (3,)],
                 lambda x, w, b, m, v: TF.batch_norm(x, m.detach(), v.detach().abs() + 0.1, w, b, training=False, eps=1e-5),
                 lambda x, w, b, m, v: x.batchnorm(w, b, m, (v.abs() + 0.1 + 1e-5).rsqrt()), atol=1e-5, grad_atol=1e-3)


def test_dropout():
  x = Tensor.ones(100, 100)
  assert (x.dropout(0.5).numpy() == 1).all(), "dropout must be the identity outside training"
  with Tensor.train():
    out = x.dropout(0.25).numpy()
  kept = out != 0
  assert 0.70 < kept.mean() < 0.80
  np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
  with Tensor.train():
    assert (x.dropout(0.0).numpy() == 1).all()
  with pytest.raises(ValueError):
    x.dropout(1.5)


def test_one_hot():
  idx = np.array([[0, 2], [1, 4]], dtype=np.int32)
  np.testing.assert_equal(Tensor(idx).one_hot(6).numpy(), TF.one_hot(torch.tensor(idx, dtype=torch.int64), 6).numpy())
  np.testing.assert_equal(Tensor(idx).one_hot().numpy(), TF.one_hot(torch.tensor(idx, dtype=torch.int64)).numpy())


@pytest.mark.parametrize("kind", ["plain", "causal", "bool_mask", "float_mask"])
def test_scaled_dot_product_attention(kind):
  rng = np.random.default_rng(3)
  mask = rng.uniform(size=(5, 7)) > 0.3
  mask[:, 0] = True
  fmask = rng.uniform(size=(5, 7)).astype(np.float32)
  shapes = [(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)]
  if kind == "causal":
    shapes = [(2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 4)]
  kws = {"plain": ({}, {}), "causal": ({"is_causal": True}, {"is_causal": True}),
         "bool_mask": ({"attn_mask": torch.tensor(mask)}, {"attn_mask": Tensor(mask)}),
         "float_mask": ({"attn_mask": torch.tensor(fmask)}, {"attn_mask": Tensor(fmask)})}[kind]
  helper_test_op(shapes, lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **kws[0]),
                 lambda q, k, v: q.scaled_dot_product_attention(k, v, **kws[1]), atol=1e-5, grad_atol=1e-3)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy(reduction):
  y = np.array([0, 3, 2, 1, 3], dtype=np.int64)
  for ls in (0.0, 0.1):
    helper_test_op([(5, 4)], lambda x: TF.cross_entropy(x, torch.tensor(y), reduction=reduction, label_smoothing=ls),
                   lambda x: x.cross_entropy(Tensor(y.astype(np.int32)), reduction=reduction, label_smoothing=ls), atol=1e-5)
  probs = np.random.default_rng(0).dirichlet(np.ones(4), size=5).astype(np.float32)
  helper_test_op([(5, 4)], lambda x: TF.cross_entropy(x, torch.tensor(probs), reduction=reduction),
                 lambda x: x.cross_entropy(Tensor(probs), reduction=reduction), atol=1e-5)
  y3 = np.array([[0, 1, 2], [2, 2, 0]], dtype=np.int64)
  helper_test_op([(2, 3, 3)], lambda x: TF.cross_entropy(x, torch.tensor(y3), reduction=reduction),
                 lambda x: x.cross_entropy(Tensor(y3.astype(np.int32)), reduction=reduction), atol=1e-5)


def test_sparse_categorical_crossentropy():
  y = np.array([0, 3, -1, 1, 3], dtype=np.int64)
  helper_test_op([(5, 4)], lambda x: TF.cross_entropy(x, torch.tensor(y), ignore_index=-1),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(y.astype(np.int32))), atol=1e-5)
  helper_test_op([(5, 4)], lambda x: TF.cross_entropy(x, torch.tensor(y), ignore_index=-1, label_smoothing=0.2),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(y.astype(np.int32)), label_smoothing=0.2), atol=1e-5)
  y2 = np.abs(y)
  helper_test_op([(5, 4)], lambda x: TF.cross_entropy(x, torch.tensor(y2), ignore_index=3, reduction="sum"),
                 lambda x: x.sparse_categorical_crossentropy(Tensor(y2.astype(np.int32)), ignore_index=3, reduction="sum"), atol=1e-5)
  helper_test_op([(5, 4)], lambda x: TF.nll_loss(TF.log_softmax(x, 1), torch.tensor(y2)),
                 lambda x: x.log_softmax(1).nll_loss(Tensor(y2.astype(np.int32))), atol=1e-5)


def test_binary_crossentropy():
  t = np.random.default_rng(0).uniform(size=(10,)).astype(np.float32)
  helper_test_op([(10,)], lambda x: TF.binary_cross_entropy(x.sigmoid(), torch.tensor(t)), lambda x: x.sigmoid().binary_crossentropy(Tensor(t)),
                 atol=1e-5)
  helper_test_op([(10,)], lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(t)), lambda x: x.binary_crossentropy_logits(Tensor(t)),
                 atol=1e-5)
  helper_test_op([(10,)], lambda x: TF.binary_cross_entropy_with_logits(x, torch.tensor(t), reduction="sum"),
                 lambda x: x.binary_crossentropy_logits(Tensor(t), reduction="sum"), atol=1e-5, low=-30, high=30)


def test_linear_and_sequential():
  helper_test_op([(4, 5), (5, 3), (3,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b), atol=1e-5)
  helper_test_op([(4, 5)], lambda x: x.relu().exp(), lambda x: x.sequential([Tensor.relu, Tensor.exp]))


def test_triu_tril():
  for d in (-1, 0, 2):
    helper_test_op([(4, 5)], lambda x: x.triu(d), lambda x: x.triu(d))
    helper_test_op([(2, 5, 4)], lambda x: x.tril(d), lambda x: x.tril(d))


# ***** movement *****

@pytest.mark.parametrize("shape,new", [((4, 6), (24,)), ((4, 6), (2, -1, 3)), ((24,), (1, 24, 1)), ((), (1, 1)), ((0, 4), (4, 0)), ((1,), ())],
                         ids=str)
def test_reshape(shape, new):
  helper_test_op([shape], lambda x: x.reshape(new))


def test_reshape_errors():
  with pytest.raises(ValueError):
    Tensor.ones(4, 6).reshape(5, 5)
  with pytest.raises(ValueError):
    Tensor.ones(4, 6).reshape(-1, -1)
  with pytest.raises(ValueError):
    Tensor.ones(4, 6).reshape(-1, 5)


def test_movement_ops():
  helper_test_op([(1, 3, 1)], lambda x: x.expand(4, 3, 2))
  helper_test_op([(3, 1)], lambda x: x.expand(2, 3, 4))
  helper_test_op([(3, 1)], lambda x: x.expand(-1, 5))
  helper_test_op([(2, 3, 4)], lambda x: x.permute(2, 0, 1))
  helper_test_op([(2, 3, 4)], lambda x: x.permute(-1, 1, 0))
  helper_test_op([(2, 3, 4)], lambda x: x.flip(0, 2), lambda x: x.flip((0, 2)))
  helper_test_op([(2, 3, 4)], lambda x: x.transpose(0, 2))
  helper_test_op([(3, 4)], lambda x: x.T)
  helper_test_op([(2, 1, 3, 1)], lambda x: x.squeeze())
  helper_test_op([(2, 1, 3, 1)], lambda x: x.squeeze(1))
  helper_test_op([(2, 1, 3, 1)], lambda x: x.squeeze(0))
  helper_test_op([(2, 3)], lambda x: x.unsqueeze(-1))
  helper_test_op([(2, 3)], lambda x: x.unsqueeze(0))
  helper_test_op([(2, 3, 4)], lambda x: x.flatten())
  helper_test_op([(2, 3, 4)], lambda x: x.flatten(1))
  helper_test_op([(2, 3, 4, 5)], lambda x: x.flatten(1, 2))
  helper_test_op([()], lambda x: x.flatten())
  helper_test_op([(2, 12)], lambda x: x.unflatten(1, (3, 4)))
  helper_test_op([(2, 12)], lambda x: x.unflatten(-1, (-1, 4)))
  helper_test_op([(2, 3)], lambda x: x.repeat(2, 3))
  helper_test_op([(2, 3)], lambda x: x.repeat(2, 1, 2))
  helper_test_op([(2, 0)], lambda x: x.repeat(2, 3))


def test_pad():
  helper_test_op([(3, 4)], lambda x: TF.pad(x, (1, 2, 3, 0)), lambda x: x.pad(((3, 0), (1, 2))))
  helper_test_op([(3, 4)], lambda x: TF.pad(x, (1, 2, 0, 1), value=5.5), lambda x: x.pad(((0, 1), (1, 2)), value=5.5))
  helper_test_op([(3, 4)], lambda x: TF.pad(x, (-1, 2, 1, -2)), lambda x: x.pad(((1, -2), (-1, 2))))
  helper_test_op([(2, 3, 4)], lambda x: TF.pad(x, (1, 1, 2, 2)), lambda x: x.pad2d((1, 1, 2, 2)))
  helper_test_op([(3, 4)], lambda x: TF.pad(x, (1, 1), value=float("-inf")), lambda x: x.pad((None, (1, 1)), value=float("-inf")),
                 forward_only=True)


def test_shrink():
  helper_test_op([(4, 5)], lambda x: x[1:3, 2:5], lambda x: x.shrink(((1, 3), (2, 5))))
  helper_test_op([(4, 5)], lambda x: x[:, 2:2], lambda x: x.shrink((None, (2, 2))))
  with pytest.raises(ValueError):
    Tensor.ones(4, 5).shrink(((0, 6), None))


def test_cat_stack_split_chunk():
  helper_test_op([(2, 3), (4, 3), (1, 3)], lambda *xs: torch.cat(xs, 0), lambda *xs: Tensor.cat(*xs, dim=0))
  helper_test_op([(2, 3), (2, 1)], lambda *xs: torch.cat(xs, -1), lambda x, y: x.cat(y, dim=-1))
  helper_test_op([(2, 3), (0, 3)], lambda *xs: torch.cat(xs, 0), lambda x, y: x.cat(y))
  helper_test_op([(2, 3), (2, 3), (2, 3)], lambda *xs: torch.stack(xs, 1), lambda *xs: Tensor.stack(*xs, dim=1))
  helper_test_op([(2, 3), (2, 3)], lambda *xs: torch.stack(xs, -1), lambda x, y: x.stack(y, dim=-1))
  helper_test_op([(7, 3)], lambda x: x.split(3)[2])
  helper_test_op([(7, 3)], lambda x: x.split([2, 5])[1], lambda x: x.split([2, 5])[1])
  helper_test_op([(3, 7)], lambda x: x.chunk(3, 1)[1], lambda x: x.chunk(3, 1)[1])
  assert len(Tensor.ones(7).chunk(3)) == len(torch.ones(7).chunk(3))
  with pytest.raises(ValueError):
    Tensor.ones(2, 3).cat(Tensor.ones(2, 4))
  with pytest.raises(ValueError):
    Tensor.ones(7).split([2, 2])


def test_cat_mixed_dtypes():
  out = Tensor([1, 2]).cat(Tensor([0.5]))
  assert out.dtype == dtypes.float32
  np.testing.assert_allclose(out.numpy(), [1, 2, 0.5])
  np.testing.assert_equal(Tensor([True]).cat(Tensor([False, True])).numpy(), [True, False, True])


def test_gather():
  idx = np.array([[0, 2, 1], [2, 2, 0]], dtype=np.int64)
  helper_test_op([(2, 4)], lambda x: x.gather(1, torch.tensor(idx)), lambda x: x.gather(1, Tensor(idx.astype(np.int32))))
  idx0 = np.array([[1, 0, 2, 1], [0, 0, 1, 2]], dtype=np.int64)
  helper_test_op([(3, 4)], lambda x: x.gather(0, torch.tensor(idx0)), lambda x: x.gather(0, Tensor(idx0.astype(np.int32))))
  idx3 = np.random.default_rng(0).integers(0, 5, size=(2, 3, 2))
  helper_test_op([(2, 3, 5)], lambda x: x.gather(-1, torch.tensor(idx3)), lambda x: x.gather(-1, Tensor(idx3.astype(np.int32))))
  with pytest.raises(ValueError):
    Tensor.ones(2, 3).gather(1, Tensor([0, 1]))


# ***** indexing *****

def torch_getitem(x, key):
  """x[key] for torch, which has no negative slice steps: those dims are flipped first and the slice rewritten."""
  key = key if isinstance(key, tuple) else (key,)
  if any(k is Ellipsis for k in key):
    i = next(j for j, k in enumerate(key) if k is Ellipsis)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
    key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
  dim, new_key, flips = 0, [], []
  for k in key:
    if k is None:
      new_key.append(k)
      continue
    if isinstance(k, slice) and k.step is not None and k.step < 0:
      n = x.shape[dim]
      idx = list(range(*k.indices(n)))
      flips.append(dim)
      new_key.append(slice(n - 1 - idx[0], n - idx[-1], -k.step) if idx else slice(0, 0))
    else:
      new_key.append(k)
    dim += 1
  return (x.flip(flips) if flips else x)[tuple(new_key)]


GETITEM = [
  1, -1, (1, 2), (slice(None), 1), (Ellipsis, 1), slice(1, 3), slice(None, None, 2), slice(None, None, -1), slice(3, 0, -2),
  (slice(None), slice(None, None, -3)), None, (slice(None), None, 1), (Ellipsis, None), (1, Ellipsis, 2), (slice(-2, None), slice(1, -1), slice(None, None, 3)),
  slice(10, None), (slice(None), slice(5, 1)), (0, 0, 0), (None, Ellipsis, None), (slice(None), slice(-1, -4, -1), slice(1, None, 2)),
  (slice(None, None, -2), slice(None, None, -1), -2), (),
]


@pytest.mark.parametrize("key", GETITEM, ids=[f"basic{i}" for i in range(len(GETITEM))])
def test_getitem_basic(key):
  helper_test_op([(5, 4, 6)], lambda x: torch_getitem(x, key), lambda x: x[key])


ADV = [
  (lambda x, t: x[t([1, 3])], None), (lambda x, t: x[t([-1, 0, 0])], None), (lambda x, t: x[:, t([0, 2])], None),
  (lambda x, t: x[t([0, 1]), t([1, 2])], None), (lambda x, t: x[t([[0, 1], [2, 3]])], None), (lambda x, t: x[t([0, 4]), :, t([1, 5])], None),
  (lambda x, t: x[:, t([0, 3]), t([1, 5])], None), (lambda x, t: x[1, t([0, 3])], None), (lambda x, t: x[t([1, 2]), 0, t([2, 3])], None),
  (lambda x, t: x[t([[1], [2]]), :, t([0, 1, 2])], None), (lambda x, t: x[..., t([5, 0])], None), (lambda x, t: x[None, t([0, 1]), None], None),
  (lambda x, t: x[t([1, 2]), 1:3], None), (lambda x, t: x[1::2, t([2, 0])], None), (lambda x, t: x[t(2)], None),
]


@pytest.mark.parametrize("fxn,_", ADV, ids=[f"adv{i}" for i in range(len(ADV))])
def test_getitem_advanced(fxn, _):
  helper_test_op([(5, 4, 6)], lambda x: fxn(x, lambda v: torch.tensor(v)), lambda x: fxn(x, lambda v: Tensor(v, dtype=dtypes.int32)))


def test_getitem_list_and_numpy_indices():
  helper_test_op([(5, 4)], lambda x: x[[1, 3]])
  helper_test_op([(5, 4)], lambda x: x[:, [0, -1]])
  helper_test_op([(5, 4)], lambda x: x[np.array([4, 0])] if isinstance(x, Tensor) else x[torch.tensor([4, 0])])


def test_getitem_dtypes():
  for dt in (np.int32, np.uint8, np.int64, np.bool_, np.float16):
    x = (np.arange(24).reshape(4, 6) % 3).astype(dt)
    np.testing.assert_equal(Tensor(x)[1:, [0, 2]].numpy(), x[1:, [0, 2]])
    np.testing.assert_equal(Tensor(x)[::-2, 1].numpy(), x[::-2, 1])


def test_getitem_errors():
  x = Tensor.ones(3, 4)
  with pytest.raises(IndexError):
    x[3]
  with pytest.raises(IndexError):
    x[0, 0, 0]
  with pytest.raises(IndexError):
    x[..., ...]
  with pytest.raises(IndexError):
    x[Tensor([0.5])]
  with pytest.raises(IndexError):
    x["a"]
  with pytest.raises(ValueError):
    x[::0]


SETITEM = [
  (1, 5.0), ((slice(None), 2), -1.0), ((slice(1, 3), slice(None, None, 2)), 7.0), ((Ellipsis, -1), 3.0), ((slice(None, None, -1), 0), 2.5),
  ((slice(None, None, -2), slice(4, 0, -3)), 9.0), ((None, 2), 1.0), ((slice(None), slice(None)), 4.0),
]


@pytest.mark.parametrize("key,val", SETITEM, ids=[f"set{i}" for i in range(len(SETITEM))])
def test_setitem_scalar(key, val):
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  t = Tensor(x)
  t[key] = val
  x[key] = val
  np.testing.assert_equal(t.numpy(), x)


def test_setitem_tensor_values():
  x = np.arange(20, dtype=np.float32).reshape(4, 5)
  t, r = Tensor(x).contiguous().realize(), torch.tensor(x)
  t[1:3, 1:4] = Tensor(np.ones((2, 3), np.float32) * 9)
  r[1:3, 1:4] = torch.ones(2, 3) * 9
  t[0] = Tensor([10.0, 11.0, 12.0, 13.0, 14.0])
  r[0] = torch.tensor([10.0, 11.0, 12.0, 13.0, 14.0])
  t[:, 0] = Tensor([-1.0])
  r[:, 0] = torch.tensor([-1.0])
  np.testing.assert_equal(t.numpy(), r.numpy())


def test_setitem_advanced():
  x = np.arange(20, dtype=np.int32).reshape(4, 5)
  t, r = Tensor(x), torch.tensor(x)
  t[Tensor([0, 2])] = 0
  r[torch.tensor([0, 2])] = 0
  t[Tensor([1, 3]), Tensor([4, 0])] = Tensor([100, 200], dtype=dtypes.int32)
  r[torch.tensor([1, 3]), torch.tensor([4, 0])] = torch.tensor([100, 200], dtype=torch.int32)
  t[:, [1, 2]] = -5
  r[:, [1, 2]] = -5
  np.testing.assert_equal(t.numpy(), r.numpy())


def test_setitem_errors():
  t = Tensor.ones(3, 4)
  with pytest.raises(ValueError):
    t[0] = Tensor.ones(5)
  with pytest.raises(TypeError):
    t[0] = "x"
  with pytest.raises(NotImplementedError):
    Tensor.ones(3, requires_grad=True)[0] = 2.0


# ***** casting *****

@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.float16), (np.float32, np.bool_),
                                     (np.int32, np.int8), (np.uint8, np.float32), (np.bool_, np.float32), (np.float64, np.float32),
                                     (np.int64, np.int32), (np.float16, np.float64)])
def test_cast(src, dst):
  x = np.array([0, 1.5, -2.25, 3, 100, -7.75]).astype(src) if src not in (np.uint8, np.bool_) else np.array([0, 1, 2, 200]).astype(src)
  ref = torch.tensor(x).to(getattr(torch, np.dtype(dst).name if dst is not np.bool_ else "bool")).numpy()
  np.testing.assert_equal(Tensor(x).cast(dtypes.from_np(dst)).numpy(), ref)


def test_cast_gradient():
  helper_test_op([(3, 4)], lambda x: x.double().square().float(), lambda x: x.double().square().float())
  helper_test_op([(3, 4)], lambda x: x.half().float() * 2, lambda x: x.half().float() * 2, atol=1e-2, grad_atol=1e-2)


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.uint32), (np.float32, np.uint8), (np.uint8, np.float32),
                                     (np.int16, np.float16), (np.float64, np.int32)])
def test_bitcast(src, dst):
  x = np.array([1.5, -2.0, 0.0, 3.25, 7.0, 1.0, 2.0, 9.0]).astype(src)
  np.testing.assert_equal(Tensor(x).bitcast(dtypes.from_np(dst)).numpy(), x.view(dst))


def test_bitcast_requires_grad_error():
  with pytest.raises(RuntimeError):
    Tensor([1.0], requires_grad=True).bitcast(dtypes.int32)


def test_bad_broadcast_raises():
  helper_test_exception([(3, 4), (5, 4)], lambda x, y: x + y, lambda x, y: x + y, expected=(ValueError,))
  helper_test_exception([(2, 3)], lambda x: x.sum(2), lambda x: x.sum(2), expected=(IndexError,))
  helper_test_exception([(2, 3)], lambda x: x.permute(0, 0), lambda x: x.permute(0, 0), expected=(ValueError,))
  with pytest.raises(TypeError):
    Tensor([1.0]) & Tensor([1.0])
  with pytest.raises(TypeError):
    Tensor([1.0]) + "a"


def test_math_constants_precision():
  # float64 keeps double precision through the composite ops
  x = np.array([0.1, 1.3, 2.7])
  np.testing.assert_allclose(Tensor(x).exp().numpy(), np.exp(x), rtol=1e-12)
  np.testing.assert_allclose(Tensor(x).sin().numpy(), np.sin(x), rtol=1e-12)
  assert Tensor(x).sqrt().dtype == dtypes.float64
  assert math.isclose(Tensor(2.0, dtype=dtypes.float64).log().item(), math.log(2.0), rel_tol=1e-12)
