"""Out-of-range indices against torch: host-known indices raise IndexError where torch raises, valid edge indices give
torch's values; integer Tensor indices read 0 by default (documented) and raise IndexError under CHECK_INDEX=1."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

from tiny.engine.jit import TinyJit  # noqa: E402
from tiny.helpers import CHECK_INDEX, Context  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402


def _data(shape):
  x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1  # +1: a masked read (0) differs from every value
  return x, Tensor(x), torch.tensor(x)


# shape, index, (value, position, axis, size) named in the error
OUT_OF_RANGE = [
  ((5,), [0, 7], (7, "1", 0, 5)),
  ((5,), [-6], (-6, "0", 0, 5)),
  ((5,), ([[0], [9]],), (9, "(1, 0)", 0, 5)),
  ((5,), (np.array([[1], [9]]),), (9, "(1, 0)", 0, 5)),
  ((5,), np.array([2, 5], dtype=np.int16), (5, "1", 0, 5)),
  ((5,), range(3, 8), (5, "2", 0, 5)),
  ((5,), ((0, 7),), (7, "1", 0, 5)),
  ((2, 3), ([0, 1], [0, 3]), (3, "1", 1, 3)),
  ((2, 3), ([0, 2], [0, 1]), (2, "1", 0, 2)),
  ((2, 3), (Ellipsis, [0, 3]), (3, "1", 1, 3)),
  ((2, 3), (None, slice(None), [[0], [-4]]), (-4, "(1, 0)", 1, 3)),
  ((2, 3, 4), (slice(None), 1, [4]), (4, "0", 2, 4)),
]


@pytest.mark.parametrize("shape,index,err", OUT_OF_RANGE, ids=[f"{s}-{i!r}" for s, i, _ in OUT_OF_RANGE])
def test_host_index_out_of_range_raises(shape, index, err):
  _, t, tt = _data(shape)
  with pytest.raises(IndexError):
    tt[index]
  value, pos, axis, size = err
  msg = rf"index {value} at position {re.escape(pos)} is out of bounds for axis {axis} with size {size} \(valid range \[{-size}, {size - 1}\]\)"
  with pytest.raises(IndexError, match=msg):
    t[index]


def test_unsigned_array_index_out_of_range_raises():
  # torch reads a uint8 index as a mask, so numpy is the reference here
  x, t, _ = _data((5,))
  idx = np.array([2, 5], dtype=np.uint8)
  with pytest.raises(IndexError):
    x[idx]
  with pytest.raises(IndexError, match="index 5 at position 1 is out of bounds for axis 0 with size 5"):
    t[idx]
  np.testing.assert_array_equal(t[idx[:1]].numpy(), x[idx[:1]])


@pytest.mark.parametrize("shape,index,bad", [((5,), 7, 7), ((5,), -6, -6), ((5,), np.int64(5), 5), ((2, 3), (1, 3), 3), ((2, 3), (-3, 0), -3)])
def test_int_index_out_of_range_raises(shape, index, bad):
  _, t, tt = _data(shape)
  with pytest.raises(IndexError):
    tt[index]
  with pytest.raises(IndexError, match=f"index {bad} is out of bounds"):
    t[index]


VALID_EDGES = [
  ((5,), [-5, 4, 0, -1]),
  ((5,), -5), ((5,), 4),
  ((5,), range(0, 5)), ((5,), range(4, -6, -3)),
  ((5,), ((4, -5),)),
  ((5,), np.array([[4], [-5]], dtype=np.int64)),
  ((2, 3), ([-2, 1], [2, -3])),
  ((2, 3), (Ellipsis, [-3, 2])),
  ((2, 3), (None, [[1], [-2]], slice(None, None, 2))),
  ((2, 3, 4), ([1, -2], slice(1, None), [-4, 3])),
  ((2, 3, 4), ([0, -1], 2, [3])),
]


@pytest.mark.parametrize("shape,index", VALID_EDGES, ids=[f"{s}-{i!r}" for s, i in VALID_EDGES])
def test_valid_edge_indices_match_torch(shape, index):
  _, t, tt = _data(shape)
  np.testing.assert_array_equal(t[index].numpy(), tt[index].numpy())


def test_setitem_host_index():
  x, t, tt = _data((5,))
  with pytest.raises(IndexError):
    tt[[0, 7]] = 9
  with pytest.raises(IndexError, match="index 7 at position 1"):
    t[[0, 7]] = 9
  np.testing.assert_array_equal(t.numpy(), x)  # nothing written
  t[[-5, 4]] = 9
  tt[[-5, 4]] = 9
  np.testing.assert_array_equal(t.numpy(), tt.numpy())


# *** Tensor indices, default mode: not checked, the kernels read 0 (torch raises) ***

def test_tensor_index_default_reads_zero():
  x, t, tt = _data((5,))
  idx = np.array([0, 9, -6, -5, 4, 5])
  with pytest.raises(IndexError):
    tt[torch.tensor(idx)]
  valid = (idx >= -5) & (idx < 5)
  np.testing.assert_array_equal(t[Tensor(idx)].numpy(), np.where(valid, x[np.where(valid, idx, 0)], 0))


@pytest.mark.parametrize("npdt", [np.int8, np.int16])
def test_negative_narrow_index_into_a_longer_axis(npdt):
  # -1 + 40000 does not fit an int16: the wrap of a negative index must not be computed in the index's own dtype
  x = np.random.default_rng(0).standard_normal((40000, 2)).astype(np.float32)
  idx = np.array([-1, -128, 5, 127], dtype=npdt)
  np.testing.assert_array_equal(Tensor(x)[Tensor(idx)].numpy(), x[idx])


def test_gather_one_hot_setitem_default_give_zero():
  x, t, tt = _data((3, 4))
  idx = np.array([[0, 3, 1, 2], [-1, 0, 2, 1]])
  with pytest.raises(RuntimeError):
    tt.gather(0, torch.tensor(idx))
  valid = (idx >= 0) & (idx < 3)
  expected = np.where(valid, np.take_along_axis(x, np.where(valid, idx, 0), 0), 0)
  np.testing.assert_array_equal(t.gather(0, Tensor(idx)).numpy(), expected)
  cls = np.array([1, 3, -1, 0])
  with pytest.raises(RuntimeError):
    TF.one_hot(torch.tensor(cls), 3)
  np.testing.assert_array_equal(Tensor(cls).one_hot(3).numpy(), (cls[:, None] == np.arange(3)).astype(np.int32))
  y, u, _ = _data((5,))
  u[Tensor([1, 8])] = 0
  y[1] = 0
  np.testing.assert_array_equal(u.numpy(), y)


# *** Tensor indices, CHECK_INDEX=1: read back and checked ***

def test_check_index_fancy():
  x, t, tt = _data((2, 5))
  with Context(CHECK_INDEX=1):
    for idx, value, pos in [([0, 5], 5, "1"), ([[1], [-6]], -6, r"\(1, 0\)")]:
      with pytest.raises(IndexError):
        tt[:, torch.tensor(idx)]
      with pytest.raises(IndexError, match=rf"index {value} at position {pos} is out of bounds for axis 1 with size 5 \(valid range \[-5, 4\]\)"):
        t[:, Tensor(idx)]
    with pytest.raises(IndexError, match="index 2 is out of bounds for axis 0 with size 2"):
      t[Tensor(2)]
    idx = [[-5, 4], [0, -1]]
    np.testing.assert_array_equal(t[Tensor([1, -2]), Tensor(idx)].numpy(), tt[torch.tensor([1, -2]), torch.tensor(idx)].numpy())
    np.testing.assert_array_equal(t[Tensor([], dtype="int32")].numpy(), x[np.array([], dtype=np.int64)])
  assert not CHECK_INDEX  # the Context restored the default


def test_check_index_setitem():
  x, t, _ = _data((5,))
  with Context(CHECK_INDEX=1):
    with pytest.raises(IndexError, match="index 8 at position 1"):
      t[Tensor([1, 8])] = 0
    np.testing.assert_array_equal(t.numpy(), x)
    t[Tensor([-1])] = 0
  x[-1] = 0
  np.testing.assert_array_equal(t.numpy(), x)


def test_check_index_gather():
  _, t, tt = _data((3, 4))
  with Context(CHECK_INDEX=1):
    for idx, value, pos in [([[0, 3], [1, 2]], 3, r"\(0, 1\)"), ([[0, 1], [-1, 2]], -1, r"\(1, 0\)")]:
      with pytest.raises(RuntimeError, match="out of bounds"):
        tt.gather(0, torch.tensor(idx))
      with pytest.raises(IndexError, match=rf"index {value} at position {pos} is out of bounds for gather along axis 0 with size 3 \(valid range \[0, 2\]\)"):
        t.gather(0, Tensor(idx))
    idx = [[2, 0, 1], [0, 2, 2]]
    np.testing.assert_array_equal(t.gather(0, Tensor(idx)).numpy(), tt.gather(0, torch.tensor(idx)).numpy())
    np.testing.assert_array_equal(t.gather(-1, Tensor([[3], [0], [1]])).numpy(), tt.gather(-1, torch.tensor([[3], [0], [1]])).numpy())


def test_check_index_one_hot():
  with Context(CHECK_INDEX=1):
    for cls, value, pos in [([1, 3], 3, "1"), ([[0], [-1]], -1, r"\(1, 0\)")]:
      with pytest.raises(RuntimeError, match="Class values"):
        TF.one_hot(torch.tensor(cls), 3)
      with pytest.raises(IndexError, match=rf"index {value} at position {pos} is out of bounds for one_hot with num_classes=3 \(valid range \[0, 2\]\)"):
        Tensor(cls).one_hot(3)
    with pytest.raises(IndexError, match="index -2"):
      Tensor([-2, 1]).one_hot()
    for cls, n in [([2, 0, 1], 3), ([[2], [0]], -1)]:
      np.testing.assert_array_equal(Tensor(cls).one_hot(n).numpy(), TF.one_hot(torch.tensor(cls), n).numpy())


def test_check_index_env_knob():
  # the knob is read from the environment like the other ContextVars
  code = "from tiny import Tensor\ntry:\n  Tensor([1, 2])[Tensor([2])]\nexcept IndexError as e:\n  print('raised', e)"
  out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CHECK_INDEX": "1"}, capture_output=True, text=True, timeout=120)
  assert "raised index 2 at position 0 is out of bounds for axis 0 with size 2" in out.stdout, out.stderr


def test_check_index_skipped_while_jit_captures():
  x, t, _ = _data((5,))
  t.realize()

  def f(t, i):
    return t[i].realize()

  plain, checked = TinyJit(f), TinyJit(f)
  for v in ([0, 4], [1, -5]):
    plain(t, Tensor(v))
  with Context(CHECK_INDEX=1):
    with pytest.raises(IndexError, match="index 9"):
      checked(t, Tensor([9, 0]))  # the first call runs eagerly: checked
    checked.reset()
    np.testing.assert_array_equal(checked(t, Tensor([0, 4])).numpy(), x[[0, 4]])
    # the capture launches no extra kernels for the check and cannot check (replays run no Python): reads 0
    np.testing.assert_array_equal(checked(t, Tensor([2, 9])).numpy(), [x[2], 0])
    assert checked.jit_kernels == plain.jit_kernels
    np.testing.assert_array_equal(checked(t, Tensor([-1, 7])).numpy(), [x[-1], 0])
