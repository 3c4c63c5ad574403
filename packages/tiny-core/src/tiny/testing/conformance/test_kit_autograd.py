"""Gradients computed on the device (the backward kernels) against gradients derived by hand in numpy (float64).

Every case backpropagates a random upstream gradient G (not ones), so a wrong broadcast or a dropped factor shows.
A few composite cases are also checked against torch when it is importable; they skip (with the reason) without it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple, cast

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from ._kit import QUICK, check, data, quick_cases

F32 = dtypes.float32
ATOL, RTOL = 1e-5, 1e-5


def backprop(fxn: Callable[..., Tensor], arrays: Sequence[np.ndarray], device: str, seed: int = 99) -> Tuple[Tensor, np.ndarray, List[Tensor]]:
  """Run fxn on device tensors of arrays and backpropagate a random upstream gradient: (output, G, input tensors)."""
  ts = [Tensor(a, device=device, requires_grad=True) for a in arrays]
  out = fxn(*ts)
  g = data(cast(Tuple[int, ...], out.shape), F32, seed=seed)
  out.backward(Tensor(g, device=device))
  return out, g.astype(np.float64), ts


def check_grads(ts: Sequence[Tensor], want: Sequence[np.ndarray], what: str, atol: float = ATOL, rtol: float = RTOL) -> None:
  """Each tensor's .grad equals the expected gradient (same shape, float32)."""
  assert len(ts) == len(want)
  for i, (t, w) in enumerate(zip(ts, want)):
    assert t.grad is not None, f"{what}: input {i} got no gradient"
    check(t.grad, w, dt=F32, atol=atol, rtol=rtol, what=f"{what}: d/d(input {i})")


def unbroadcast(g: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
  """The gradient of an operand broadcast from shape: g summed over the axes broadcasting added or stretched."""
  g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
  return g.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1), keepdims=True).reshape(shape)


# *** elementwise ***

# name, tiny fxn, d/da and d/db of the numpy function (in float64), input ranges
BINARY: List[Tuple[str, Callable[[Tensor, Tensor], Tensor], Callable[[Any, Any], Tuple[Any, Any]], Tuple[float, float], Tuple[float, float]]] = [
  ("add", lambda a, b: a + b, lambda a, b: (np.ones_like(a), np.ones_like(b)), (-2, 2), (-2, 2)),
  ("sub", lambda a, b: a - b, lambda a, b: (np.ones_like(a), -np.ones_like(b)), (-2, 2), (-2, 2)),
  ("mul", lambda a, b: a * b, lambda a, b: (b, a), (-2, 2), (-2, 2)),
  ("div", lambda a, b: a / b, lambda a, b: (1 / b, -a / b ** 2), (-2, 2), (0.5, 2)),
  ("maximum", lambda a, b: a.maximum(b), lambda a, b: ((a > b) * 1.0, (b > a) * 1.0), (-2, 2), (-2, 2)),
  ("minimum", lambda a, b: a.minimum(b), lambda a, b: ((a < b) * 1.0, (b < a) * 1.0), (-2, 2), (-2, 2)),
  ("pow", lambda a, b: a.pow(b), lambda a, b: (b * a ** (b - 1), a ** b * np.log(a)), (0.5, 2), (-1.5, 1.5)),
]

UNARY: List[Tuple[str, Callable[[Tensor], Tensor], Callable[[Any], Any], Tuple[float, float]]] = [
  ("neg", lambda a: -a, lambda a: -np.ones_like(a), (-2, 2)),
  ("exp", lambda a: a.exp(), np.exp, (-2, 2)),
  ("log", lambda a: a.log(), lambda a: 1 / a, (0.25, 3)),
  ("sqrt", lambda a: a.sqrt(), lambda a: 0.5 / np.sqrt(a), (0.25, 3)),
  ("sin", lambda a: a.sin(), np.cos, (-3, 3)),
  ("relu", lambda a: a.relu(), lambda a: (a > 0) * 1.0, (-2, 2)),
  ("sigmoid", lambda a: a.sigmoid(), lambda a: np.exp(-a) / (1 + np.exp(-a)) ** 2, (-3, 3)),
  ("tanh", lambda a: a.tanh(), lambda a: 1 - np.tanh(a) ** 2, (-2, 2)),
  ("reciprocal", lambda a: a.reciprocal(), lambda a: -1 / a ** 2, (0.5, 2)),
  ("square", lambda a: a.square(), lambda a: 2 * a, (-2, 2)),
  ("abs", lambda a: a.abs(), np.sign, (-2, 2)),
]


def _apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """b moved away from a where they are close, so max/min/relu have no ties (where the gradient is a convention)."""
  return np.where(np.abs(a - b) < 0.1, a + 0.5, b).astype(b.dtype)


@pytest.mark.parametrize("row", quick_cases(BINARY, lambda r: r[0] in ("div", "maximum"), ids=lambda r: r[0]))
def test_binary_grad(row, tiny_device):
  name, fxn, dfxn, ra, rb = row
  a, b = data((3, 4), F32, seed=1, low=ra[0], high=ra[1]), data((3, 4), F32, seed=2, low=rb[0], high=rb[1])
  b = _apart(a, b) if name in ("maximum", "minimum") else b
  _, g, ts = backprop(fxn, [a, b], tiny_device)
  da, db = dfxn(a.astype(np.float64), b.astype(np.float64))
  check_grads(ts, [g * da, g * db], name)


@pytest.mark.parametrize("row", quick_cases(UNARY, lambda r: r[0] in ("relu", "tanh"), ids=lambda r: r[0]))
def test_unary_grad(row, tiny_device):
  name, fxn, dfxn, (lo, hi) = row
  a = data((3, 5), F32, seed=3, low=lo, high=hi)
  if name in ("relu", "abs"):
    a = np.where(np.abs(a) < 0.1, 0.5, a).astype(np.float32)   # no kink at 0
  _, g, ts = backprop(fxn, [a], tiny_device)
  check_grads(ts, [g * dfxn(a.astype(np.float64))], name)


def test_chain_rule_and_fanout(tiny_device):
  """One input used three times (the gradients add up) through a chain of ops."""
  a = data((4, 3), F32, seed=4, low=0.5, high=2)
  _, g, ts = backprop(lambda x: (x * x).exp().mul(x.log()) + x, [a], tiny_device)
  x = a.astype(np.float64)
  # d/dx [exp(x^2) log x + x] = 2x exp(x^2) log x + exp(x^2)/x + 1
  check_grads(ts, [g * (2 * x * np.exp(x * x) * np.log(x) + np.exp(x * x) / x + 1)], "exp(x*x)*log(x)+x", rtol=1e-5, atol=1e-4)


# *** broadcasting ***

PAIRS = [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5, 1, 3), (1, 4, 1)), ((2, 3), ()), ((1,), (2, 3))]


@pytest.mark.parametrize("op,sa,sb", quick_cases([(op, sa, sb) for op in ("add", "mul", "div") for sa, sb in PAIRS],
                                                  lambda c: c == ("div", (5, 1, 3), (1, 4, 1)), ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}", unpack=True))
def test_broadcast_grad(op, sa, sb, tiny_device):
  a, b = data(sa, F32, seed=5), data(sb, F32, seed=6, low=0.5, high=2)
  fxn = {"add": lambda x, y: x + y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y}[op]
  out, g, ts = backprop(fxn, [a, b], tiny_device)
  x, y = np.broadcast_arrays(a.astype(np.float64), b.astype(np.float64))
  da, db = {"add": (np.ones_like(x), np.ones_like(y)), "mul": (y, x), "div": (1 / y, -x / y ** 2)}[op]
  check_grads(ts, [unbroadcast(g * da, sa), unbroadcast(g * db, sb)], f"{op} broadcast {sa} with {sb}", atol=1e-4)


def test_python_scalar_operand_grad(tiny_device):
  a = data((2, 3), F32, seed=7, low=0.5, high=2)
  _, g, ts = backprop(lambda x: 3 / x - x * 2 + 1, [a], tiny_device)
  check_grads(ts, [g * (-3 / a.astype(np.float64) ** 2 - 2)], "3/x - 2x + 1")


# *** reductions ***

def _distinct(shape: Tuple[int, ...], seed: int) -> np.ndarray:
  """Values without ties (a shuffled arange, scaled): max has one winner per reduced slice."""
  n = int(np.prod(shape))
  return (np.random.default_rng(seed).permutation(n).astype(np.float32).reshape(shape) - n / 2) / 4


RED_AXES: List[Any] = [None, 0, 1, (0, 2)]


@pytest.mark.parametrize("kind,axis", quick_cases([(k, ax) for k in ("sum", "max", "mean") for ax in RED_AXES],
                                                   lambda c: c in (("max", (0, 2)), ("mean", 1)), ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_reduce_grad(kind, axis, tiny_device):
  shape = (3, 4, 5)
  a = _distinct(shape, seed=8)
  _, g, ts = backprop(lambda x: getattr(x, kind)(axis), [a], tiny_device)
  axes = tuple(range(3)) if axis is None else ((axis,) if isinstance(axis, int) else axis)
  gk = np.expand_dims(g, axes)
  if kind == "sum":
    want = np.broadcast_to(gk, shape)
  elif kind == "mean":
    want = np.broadcast_to(gk, shape) / np.prod([shape[i] for i in axes])
  else:
    want = (a == a.max(axes, keepdims=True)) * gk
  check_grads(ts, [want], f"{kind}({axis})")


def test_max_grad_ties_share(tiny_device):
  """Elements tied for the max share its gradient equally (torch's amax rule)."""
  a = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-1.0, -5.0, -1.0, -3.0]], np.float32)
  _, g, ts = backprop(lambda x: x.max(1), [a], tiny_device)
  is_max = a == a.max(1, keepdims=True)
  check_grads(ts, [is_max * g[:, None] / is_max.sum(1, keepdims=True)], "max with ties")


def test_keepdim_and_chained_reduce_grad(tiny_device):
  a = data((4, 6), F32, seed=9)
  _, g, ts = backprop(lambda x: (x - x.mean(1, keepdim=True)).square().sum(0), [a], tiny_device)
  # y_j = sum_i (x_ij - m_i)^2, m_i = mean_j x_ij: dy_j/dx_ik = 2 (x_ik - m_i) (delta_jk - 1/n)
  x, n = a.astype(np.float64), a.shape[1]
  d = x - x.mean(1, keepdims=True)
  want = 2 * d * g[None, :] - 2 * (d * g[None, :]).sum(1, keepdims=True) / n
  check_grads(ts, [want], "sum((x - mean)^2)", atol=1e-4)


# *** movement ***

def _pad_np(g: np.ndarray, arg: Sequence[Tuple[int, int]]) -> np.ndarray:
  return np.pad(g, arg)


# name, tiny fxn on (3, 4, 5), gradient of the numpy equivalent given g (its output-shaped upstream gradient)
MOVEMENT: Dict[str, Tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
  "pad": (lambda x: x.pad(((1, 2), (0, 0), (2, 1))), lambda g: g[1:4, :, 2:7]),
  "shrink": (lambda x: x.shrink(((1, 3), (0, 4), (2, 5))), lambda g: _pad_np(g, ((1, 0), (0, 0), (2, 0)))),
  "permute": (lambda x: x.permute(2, 0, 1), lambda g: g.transpose(1, 2, 0)),
  "flip": (lambda x: x.flip((0, 2)), lambda g: g[::-1, :, ::-1]),
  "expand": (lambda x: x.reshape(3, 1, 4, 5).expand(3, 2, 4, 5), lambda g: g.sum(1)),
  "reshape": (lambda x: x.reshape(12, 5), lambda g: g.reshape(3, 4, 5)),
  "stride": (lambda x: x[::2, 1::2, ::-2], lambda g: _strided_back(g)),
  "pad_shrink_flip": (lambda x: x.pad(((0, 0), (1, 1), (0, 0))).shrink(((0, 3), (0, 5), (1, 4))).flip(1),
                      lambda g: _pad_np(g[:, ::-1][:, 1:], ((0, 0), (0, 0), (1, 1)))),
}


def _strided_back(g: np.ndarray) -> np.ndarray:
  out = np.zeros((3, 4, 5))
  out[::2, 1::2, ::-2] = g
  return out


@pytest.mark.parametrize("name", quick_cases(list(MOVEMENT), lambda n: n in ("pad_shrink_flip", "expand")))
def test_movement_grad(name, tiny_device):
  fxn, back = MOVEMENT[name]
  a = data((3, 4, 5), F32, seed=10)
  out, g, ts = backprop(lambda x: fxn(x) * 1.0, [a], tiny_device)
  want = back(g)
  assert want.shape == a.shape, f"kit bug: reference gradient of {name} has shape {want.shape}"
  check_grads(ts, [want], name)


def test_getitem_and_cat_grad(tiny_device):
  a, b = data((4, 5), F32, seed=11), data((2, 5), F32, seed=12)
  _, g, ts = backprop(lambda x, y: x[1:3].cat(y, dim=0)[:, 2:] * x[0:4, 0:3], [a, b], tiny_device)
  # out (4, 3) = cat(x[1:3], y)[:, 2:] * x[:, :3]
  c = np.concatenate([a[1:3], b], 0).astype(np.float64)
  x = a.astype(np.float64)
  da, db = np.zeros((4, 5)), np.zeros((2, 5))
  da[1:3, 2:] += (g * x[:, :3])[:2]
  db[:, 2:] += (g * x[:, :3])[2:]
  da[:, :3] += g * c[:, 2:]
  check_grads(ts, [da, db], "getitem + cat")


# *** matmul and conv2d ***

@pytest.mark.parametrize("sa,sb", quick_cases([((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((5,), (5, 3)), ((2, 1, 3, 4), (3, 4, 2))],
                                               lambda p: p == ((2, 3, 4), (4, 2)), ids=str, unpack=True))
def test_matmul_grad(sa, sb, tiny_device):
  a, b = data(sa, F32, seed=13), data(sb, F32, seed=14)
  _, g, ts = backprop(lambda x, y: x @ y, [a, b], tiny_device)
  x, y = a.astype(np.float64), b.astype(np.float64)
  # numpy's matmul broadcasting: promote vectors, differentiate, then sum out broadcast batch dims
  x2 = x[None, :] if x.ndim == 1 else x
  y2 = y[:, None] if y.ndim == 1 else y
  g2 = g.reshape(np.matmul(x2, y2).shape)
  da, db = g2 @ np.swapaxes(y2, -1, -2), np.swapaxes(x2, -1, -2) @ g2
  check_grads(ts, [unbroadcast(da, x2.shape).reshape(sa), unbroadcast(db, y2.shape).reshape(sb)], f"{sa} @ {sb}", atol=1e-4)


def conv2d_and_grads_np(x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
                        groups: int = 1) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(out, dx, dw) of an NCHW cross-correlation in float64; g is the upstream gradient of out."""
  x, w = x.astype(np.float64), w.astype(np.float64)
  n, cin, h, wd = x.shape
  cout, cin_g, kh, kw = w.shape
  xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  oh, ow = (xp.shape[2] - dilation * (kh - 1) - 1) // stride + 1, (xp.shape[3] - dilation * (kw - 1) - 1) // stride + 1
  assert g.shape == (n, cout, oh, ow)
  out, dxp, dw = np.zeros((n, cout, oh, ow)), np.zeros_like(xp), np.zeros_like(w)
  per_group = cout // groups
  for o in range(cout):
    c0 = (o // per_group) * cin_g
    for i in range(oh):
      for j in range(ow):
        rows = slice(i * stride, i * stride + dilation * (kh - 1) + 1, dilation)
        cols = slice(j * stride, j * stride + dilation * (kw - 1) + 1, dilation)
        patch = xp[:, c0:c0 + cin_g, rows, cols]
        out[:, o, i, j] = (patch * w[o]).sum(axis=(1, 2, 3))
        dw[o] += (patch * g[:, o, i, j][:, None, None, None]).sum(0)
        dxp[:, c0:c0 + cin_g, rows, cols] += w[o][None] * g[:, o, i, j][:, None, None, None]
  return out, dxp[:, :, padding:padding + h, padding:padding + wd], dw


CONV = [
  ((2, 2, 5, 5), (3, 2, 3, 3), {}),
  ((1, 2, 5, 6), (2, 2, 3, 3), {"padding": 1}),
  ((1, 2, 7, 6), (2, 2, 3, 2), {"stride": 2}),
  ((1, 1, 7, 7), (2, 1, 3, 3), {"dilation": 2}),
  ((1, 4, 5, 5), (4, 2, 3, 3), {"groups": 2, "padding": 1}),
]


@pytest.mark.parametrize("xs,ws,kw", quick_cases(CONV, lambda c: c[2] == {"padding": 1}, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}", unpack=True))
def test_conv2d_grad(xs, ws, kw, tiny_device):
  """Stride 1 without groups takes tiny's direct conv backward; the others differentiate the composed pooling."""
  x, w, bias = data(xs, F32, seed=15), data(ws, F32, seed=16), data((ws[0],), F32, seed=17)
  out, g, ts = backprop(lambda a, b, c: a.conv2d(b, c, **kw), [x, w, bias], tiny_device)
  want_out, dx, dw = conv2d_and_grads_np(x, w, g, **kw)
  check(out, want_out + bias.astype(np.float64)[None, :, None, None], dt=F32, atol=1e-5, rtol=1e-5, what="conv2d forward")
  check_grads(ts, [dx, dw, g.sum(axis=(0, 2, 3))], f"conv2d {kw}", atol=1e-4)


# *** gather and indexing ***

def test_gather_grad(tiny_device):
  a = data((4, 5), F32, seed=18)
  idx = np.array([[0, 4, 4], [1, 1, 1], [3, 0, 2], [2, 2, 0]], np.int32)   # repeats: their gradients add up
  _, g, ts = backprop(lambda x: x.gather(1, Tensor(idx, device=tiny_device)), [a], tiny_device)
  want = np.zeros((4, 5))
  np.add.at(want, (np.arange(4)[:, None].repeat(3, 1), idx), g)
  check_grads(ts, [want], "gather dim 1")


def test_gather_dim0_grad(tiny_device):
  a = data((3, 4), F32, seed=19)
  idx = np.array([[2, 0, 1, 2], [2, 2, 0, 1]], np.int32)
  _, g, ts = backprop(lambda x: x.gather(0, Tensor(idx, device=tiny_device)), [a], tiny_device)
  want = np.zeros((3, 4))
  np.add.at(want, (idx, np.arange(4)[None, :].repeat(2, 0)), g)
  check_grads(ts, [want], "gather dim 0")


@QUICK
def test_tensor_index_grad(tiny_device):
  """Advanced indexing with an index Tensor (an embedding lookup): rows picked twice get both gradients."""
  a = data((5, 3), F32, seed=20)
  rows = np.array([4, 0, 4, 2, 4], np.int32)
  _, g, ts = backprop(lambda x: x[Tensor(rows, device=tiny_device)], [a], tiny_device)
  want = np.zeros((5, 3))
  np.add.at(want, rows, g)
  check_grads(ts, [want], "x[index tensor]")


# *** softmax, log_softmax, a small MLP ***

def _softmax_np(x: np.ndarray, axis: int) -> np.ndarray:
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("kind,axis", quick_cases([(k, ax) for k in ("softmax", "log_softmax") for ax in (1, 0)],
                                                   lambda c: c == ("log_softmax", 1), ids=lambda c: f"{c[0]}-{c[1]}", unpack=True))
def test_softmax_grad(kind, axis, tiny_device):
  a = data((4, 6), F32, seed=21, low=-3, high=3)
  out, g, ts = backprop(lambda x: getattr(x, kind)(axis), [a], tiny_device)
  s = _softmax_np(a.astype(np.float64), axis)
  if kind == "softmax":
    want_out, want = s, s * (g - (g * s).sum(axis, keepdims=True))
  else:
    want_out, want = np.log(s), g - s * g.sum(axis, keepdims=True)
  check(out, want_out, dt=F32, atol=1e-5, rtol=1e-5, transcendental=True, what=f"{kind} forward")
  check_grads(ts, [want], f"{kind}({axis})")


def mlp_loss_and_grads_np(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray,
                          labels: np.ndarray) -> Tuple[float, List[np.ndarray]]:
  """Mean cross entropy of relu(x @ w1 + b1) @ w2 + b2 and its gradients (x, w1, b1, w2, b2), by hand in float64."""
  x, w1, b1, w2, b2 = (v.astype(np.float64) for v in (x, w1, b1, w2, b2))
  n = x.shape[0]
  pre = x @ w1 + b1
  h = np.maximum(pre, 0)
  logits = h @ w2 + b2
  p = _softmax_np(logits, 1)
  loss = -np.log(p[np.arange(n), labels]).mean()
  dlogits = p.copy()
  dlogits[np.arange(n), labels] -= 1
  dlogits /= n
  dh = dlogits @ w2.T
  dpre = dh * (pre > 0)
  return float(loss), [dpre @ w1.T, x.T @ dpre, dpre.sum(0), h.T @ dlogits, dlogits.sum(0)]


def test_mlp_loss_grad(tiny_device):
  x, w1, b1 = data((8, 6), F32, seed=22), data((6, 10), F32, seed=23, low=-1, high=1), data((10,), F32, seed=24, low=-0.5, high=0.5)
  w2, b2 = data((10, 4), F32, seed=25, low=-1, high=1), data((4,), F32, seed=26, low=-0.5, high=0.5)
  labels = np.array([0, 3, 1, 1, 2, 0, 3, 2], np.int32)
  ts = [Tensor(v, device=tiny_device, requires_grad=True) for v in (x, w1, b1, w2, b2)]
  loss = (ts[0] @ ts[1] + ts[2]).relu().matmul(ts[3]).add(ts[4]).sparse_categorical_crossentropy(Tensor(labels, device=tiny_device))
  loss.backward()
  want_loss, want = mlp_loss_and_grads_np(x, w1, b1, w2, b2, labels)
  check(loss, np.float64(want_loss), dt=F32, atol=1e-5, rtol=1e-5, what="MLP loss")
  check_grads(ts, want, "MLP cross-entropy loss")


# *** against torch (where importable) ***

def _torch() -> Any:
  try:
    import torch
  except ImportError:
    pytest.skip("torch is not importable here: these cases compare with torch (the numpy-derived cases above still ran)")
  return torch


TORCH_CASES: Dict[str, Tuple[List[Tuple[int, ...]], Callable[..., Any], Callable[..., Any]]] = {
  # name: (input shapes, tiny fxn, torch fxn)
  "layernorm": ([(3, 8)], lambda x: x.layernorm(), lambda x, F: F.layer_norm(x, (8,))),
  "conv2d_stride_dilation_groups": ([(1, 4, 9, 9), (4, 2, 3, 3)], lambda x, w: x.conv2d(w, groups=2, stride=2, dilation=2, padding=2),
                                    lambda x, w, F: F.conv2d(x, w, groups=2, stride=2, dilation=2, padding=2)),
  "max_pool2d": ([(1, 2, 6, 6)], lambda x: x.max_pool2d(2), lambda x, F: F.max_pool2d(x, 2)),
  "avg_pool2d_pad": ([(1, 2, 5, 5)], lambda x: x.avg_pool2d(3, stride=2, padding=1),
                     lambda x, F: F.avg_pool2d(x, 3, stride=2, padding=1)),
  "gelu_softplus": ([(4, 5)], lambda x: x.gelu() + x.softplus(), lambda x, F: F.gelu(x, approximate="tanh") + F.softplus(x)),
  "logsumexp_cumsum": ([(3, 6)], lambda x: x.cumsum(1).logsumexp(0), lambda x, F: x.cumsum(1).logsumexp(0)),
}


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_grad_against_torch(name, tiny_device):
  torch = _torch()
  shapes, fxn, tfxn = TORCH_CASES[name]
  arrays = [data(s, F32, seed=30 + i) for i, s in enumerate(shapes)]
  out, g, ts = backprop(fxn, arrays, tiny_device)
  tts = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
  tout = tfxn(*tts, torch.nn.functional)
  tout.backward(torch.tensor(g))
  check(out, tout.detach().numpy(), dt=F32, atol=1e-5, rtol=1e-4, what=f"{name} forward vs torch")
  check_grads(ts, [t.grad.numpy() for t in tts], f"{name} vs torch", atol=1e-4, rtol=1e-4)


def test_grad_does_not_flow_into_detached_or_int(tiny_device):
  """detach() stops the gradient; a tensor that does not require grad gets none."""
  a, b = data((3,), F32, seed=40), data((3,), F32, seed=41)
  x, y = Tensor(a, device=tiny_device, requires_grad=True), Tensor(b, device=tiny_device)
  out = (x * x.detach() + y).sum()
  out.backward()
  assert y.grad is None and x.grad is not None
  check(x.grad, a.astype(np.float64), dt=F32, what="d/dx sum(x * detach(x))")
