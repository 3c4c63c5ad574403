"""WINO=1: Winograd F(4x4, 3x3) conv2d (tiny.winograd) against torch's conv2d, forward and backward."""
import numpy as np
import pytest

import tiny.winograd as wino
from tiny.dtype import dtypes
from tiny.helpers import Context
from tiny.tensor import Tensor

torch = pytest.importorskip("torch", reason="torch is the reference for the Winograd conv tests (pip install torch==2.13.0)")


@pytest.fixture
def spy(monkeypatch):
  """Records, for every conv2d call, whether the Winograd path computed it (conv2d looks winograd_conv2d up per call)."""
  taken = []
  real = wino.winograd_conv2d

  def recording(*args, **kwargs):
    out = real(*args, **kwargs)
    taken.append(out is not None)
    return out

  monkeypatch.setattr(wino, "winograd_conv2d", recording)
  return taken


def torch_pads(padding):
  """tiny's padding argument -> (padding for torch's conv2d, explicit F.pad list or None)."""
  if isinstance(padding, int):
    return padding, None
  if len(padding) == 2:
    return tuple(padding), None
  return 0, list(padding)  # pad2d order is torch's F.pad order


def check(bs, cin, cout, h, w, padding, groups=1, bias=True, stride=1, dilation=1, k=3, seed=0, atol=2e-4):
  rng = np.random.RandomState(seed)
  x = rng.randn(bs, cin, h, w).astype(np.float32)
  wt = rng.randn(cout, cin // groups, k, k).astype(np.float32)
  b = rng.randn(cout).astype(np.float32) if bias else None
  tx, tw = Tensor(x, requires_grad=True), Tensor(wt, requires_grad=True)
  tb = Tensor(b, requires_grad=True) if bias else None
  with Context(WINO=1):
    out = tx.conv2d(tw, tb, groups=groups, stride=stride, dilation=dilation, padding=padding)
    seed_grad = rng.randn(*out.shape).astype(np.float32)
    (out * Tensor(seed_grad)).sum().backward()
    got = [out.numpy(), tx.grad.numpy(), tw.grad.numpy()] + ([tb.grad.numpy()] if bias else [])
  rx, rw = torch.tensor(x, requires_grad=True), torch.tensor(wt, requires_grad=True)
  rb = torch.tensor(b, requires_grad=True) if bias else None
  pad, explicit = torch_pads(padding)
  xin = torch.nn.functional.pad(rx, explicit) if explicit else rx
  rout = torch.nn.functional.conv2d(xin, rw, rb, stride=stride, padding=pad, dilation=dilation, groups=groups)
  (rout * torch.tensor(seed_grad)).sum().backward()
  want = [rout.detach().numpy(), rx.grad.numpy(), rw.grad.numpy()] + ([rb.grad.numpy()] if bias else [])
  for what, g, r in zip(["out", "dx", "dw", "db"], got, want):
    assert g.shape == r.shape, (what, g.shape, r.shape)
    np.testing.assert_allclose(g, r, atol=atol * max(1.0, float(np.abs(r).max())), rtol=1e-4, err_msg=what)


@pytest.mark.parametrize("bs,cin,cout,h,w,padding", [
  (2, 3, 4, 8, 8, 1),     # whole tiles
  (1, 2, 3, 10, 6, 0),    # no padding, non-square
  (3, 1, 2, 9, 7, 1),     # odd sizes: the last tiles need padding
  (2, 4, 5, 5, 11, 2),    # padding wider than the kernel's reach
  (2, 3, 2, 3, 3, 0),     # a single output pixel
  (1, 2, 2, 7, 6, (1, 0)),          # per-dim padding (top/bottom, left/right)
  (2, 2, 3, 6, 9, [0, 2, 1, 0]),    # pad2d order (left, right, top, bottom), as conv_transpose2d passes it
])
def test_forward_backward_match_torch(spy, bs, cin, cout, h, w, padding):
  check(bs, cin, cout, h, w, padding)
  assert spy and all(spy), spy  # every conv2d call (forward) went through Winograd


def test_groups_and_no_bias(spy):
  check(2, 4, 6, 7, 7, 1, groups=2, bias=False)
  assert spy and all(spy)


@pytest.mark.parametrize("kw", [dict(stride=2), dict(dilation=2, h=9, w=9), dict(k=5, padding=2), dict(k=1, padding=0)])
def test_ineligible_convs_take_the_regular_path(spy, kw):
  args = dict(bs=2, cin=3, cout=4, h=8, w=8, padding=1)
  args.update(kw)
  check(**args, atol=1e-5)
  assert spy and not any(spy), spy


def test_other_ranks_and_dtypes_are_not_taken(spy):
  with Context(WINO=1):
    x1, w1 = np.random.randn(2, 3, 10).astype(np.float32), np.random.randn(4, 3, 3).astype(np.float32)
    np.testing.assert_allclose(Tensor(x1).conv2d(Tensor(w1), padding=1).numpy(),
                               torch.nn.functional.conv1d(torch.tensor(x1), torch.tensor(w1), padding=1).numpy(), atol=1e-5)
    xi, wi = np.arange(2 * 5 * 5).reshape(1, 2, 5, 5), np.ones((1, 2, 3, 3), dtype=np.int32)
    got = Tensor(xi.astype(np.int32)).conv2d(Tensor(wi))
    assert got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), torch.nn.functional.conv2d(torch.tensor(xi, dtype=torch.float64),
                                                                         torch.tensor(wi, dtype=torch.float64)).numpy().astype(np.int32))
  assert spy == [False, False]


def test_off_by_default(spy):
  x, w = Tensor.randn(1, 2, 6, 6), Tensor.randn(3, 2, 3, 3)
  with Context(WINO=0):
    x.conv2d(w, padding=1)
  assert spy == [False]
  with Context(WINO=1):
    x.conv2d(w, padding=1)
  assert spy == [False, True]


def test_errors_unchanged():
  with Context(WINO=1):
    with pytest.raises(Exception, match="input channels"):
      Tensor.randn(1, 4, 6, 6).conv2d(Tensor.randn(2, 3, 3, 3))


def test_transform_matrices():
  # the 1-D identity the 2-D algorithm is built from: At [(G g) * (Bt d)] is the correlation of a 6-sample d with a 3-tap g
  G, Bt, At = (np.array(m, dtype=np.float64) for m in (wino.WINO_G, wino.WINO_BT, wino.WINO_AT))  # noqa: N806
  rng = np.random.RandomState(3)
  for _ in range(5):
    g, d = rng.randn(3), rng.randn(6)
    np.testing.assert_allclose(At @ ((G @ g) * (Bt @ d)), np.correlate(d, g, mode="valid"), atol=1e-12)
