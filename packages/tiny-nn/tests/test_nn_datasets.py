"""tiny_nn.datasets: IDX/MNIST files written here, and the scikit-learn digits set."""
import gzip
import struct

import numpy as np
import pytest

from tiny_nn.datasets import DatasetError, digits, mnist, read_idx


def idx_bytes(arr, code=0x08):
  return b"\0\0" + bytes([code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_mnist(d, n_train=5, n_test=3, gz=True):
  rng = np.random.RandomState(0)
  data = {}
  for split, n in (("train", n_train), ("t10k", n_test)):
    data[split] = (rng.randint(0, 256, (n, 28, 28)).astype(np.uint8), rng.randint(0, 10, n).astype(np.uint8))
    for kind, arr, rank in (("images", data[split][0], 3), ("labels", data[split][1], 1)):
      raw = idx_bytes(arr)
      name = d / f"{split}-{kind}-idx{rank}-ubyte"
      if gz:
        (d / (name.name + ".gz")).write_bytes(gzip.compress(raw))
      else:
        name.write_bytes(raw)
  return data


@pytest.mark.parametrize("gz", [True, False])
def test_mnist(tmp_path, gz):
  data = write_mnist(tmp_path, gz=gz)
  xtr, ytr, xte, yte = mnist(tmp_path)
  assert xtr.shape == (5, 1, 28, 28) and xte.shape == (3, 1, 28, 28)
  np.testing.assert_array_equal(xtr.numpy()[:, 0], data["train"][0])
  np.testing.assert_array_equal(ytr.numpy(), data["train"][1])
  np.testing.assert_array_equal(xte.numpy()[:, 0], data["t10k"][0])
  np.testing.assert_array_equal(yte.numpy(), data["t10k"][1])


def test_read_idx_types(tmp_path):
  a = np.arange(-3, 3, dtype=np.int32).reshape(2, 3)
  (tmp_path / "a").write_bytes(idx_bytes(a, 0x0C))
  np.testing.assert_array_equal(read_idx(tmp_path / "a"), a)
  f = np.array([1.5, -2.25], dtype=np.float32)
  (tmp_path / "f").write_bytes(idx_bytes(f, 0x0D))
  np.testing.assert_array_equal(read_idx(tmp_path / "f"), f)


def test_malformed_idx(tmp_path):
  good = idx_bytes(np.zeros((2, 3), dtype=np.uint8))
  cases = {"magic": b"\x01\x02" + good[2:], "element type": good[:2] + b"\x42" + good[3:], "header": good[:6],
           "bytes of data": good[:-1], "gzip": gzip.compress(good)[:-6]}
  for match, raw in cases.items():
    (tmp_path / "x").write_bytes(raw)
    with pytest.raises(DatasetError, match=match):
      read_idx(tmp_path / "x")
  with pytest.raises(DatasetError, match="not found"):
    mnist(tmp_path)


def test_digits_split():
  sk = pytest.importorskip("sklearn.datasets", reason="the digits set ships with scikit-learn (pip install scikit-learn)")
  ref = sk.load_digits()
  xtr, ytr, xte, yte = digits()
  assert xtr.shape == (1437, 1, 8, 8) and xte.shape == (360, 1, 8, 8) and ytr.shape == (1437,) and yte.shape == (360,)
  x = np.concatenate([xtr.numpy(), xte.numpy()]).reshape(-1, 64)
  y = np.concatenate([ytr.numpy(), yte.numpy()])
  assert x.min() == 0 and x.max() == 1
  # the split is a permutation of the whole set: every (image, label) pair appears exactly once
  ours = sorted(zip(map(bytes, (x * 16).round().astype(np.uint8)), y.tolist()))
  theirs = sorted(zip(map(bytes, ref.data.astype(np.uint8)), ref.target.tolist()))
  assert ours == theirs
  # and it is fixed
  np.testing.assert_array_equal(digits()[3].numpy(), yte.numpy())
  assert set(yte.numpy().tolist()) == set(range(10))
