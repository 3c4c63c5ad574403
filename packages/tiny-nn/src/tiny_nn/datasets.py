"""Datasets from local files or installed packages (nothing is downloaded at run time)."""
from __future__ import annotations

import gzip
import os
import struct
from typing import Tuple

import numpy as np

from tiny.tensor import Tensor

__all__ = ["DatasetError", "digits", "mnist", "read_idx"]

# IDX type codes -> big-endian numpy dtypes
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DatasetError(ValueError):
  """A dataset file is missing, truncated or malformed."""


def read_idx(path: "str | os.PathLike[str]") -> np.ndarray:
  """Reads one IDX file (the MNIST format), gzip-compressed or raw, into a numpy array of its declared shape and type."""
  path = os.fspath(path)
  with open(path, "rb") as f:
    raw = f.read()
  if raw[:2] == b"\x1f\x8b":
    try:
      raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:
      raise DatasetError(f"{path}: broken gzip stream: {e}") from None
  if len(raw) < 4 or raw[:2] != b"\x00\x00":
    raise DatasetError(f"{path}: not an IDX file (bad magic {raw[:4]!r})")
  code, ndim = raw[2], raw[3]
  if code not in _IDX_DTYPES:
    raise DatasetError(f"{path}: unknown IDX element type 0x{code:02x}")
  if len(raw) < 4 + 4 * ndim:
    raise DatasetError(f"{path}: truncated IDX header")
  shape = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
  dt = np.dtype(_IDX_DTYPES[code])
  need = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
  body = raw[4 + 4 * ndim:]
  if len(body) != need:
    raise DatasetError(f"{path}: IDX header says {shape} of {dt} ({need} bytes) but the file has {len(body)} bytes of data")
  return np.frombuffer(body, dtype=dt).reshape(shape).astype(dt.newbyteorder("="))


def _find(directory: str, stem: str) -> str:
  for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
    p = os.path.join(directory, name)
    if os.path.exists(p):
      return p
  raise DatasetError(f"MNIST file {stem}[.gz] not found in {directory}")


def mnist(path: "str | os.PathLike[str]") -> Tuple[Tensor, Tensor, Tensor, Tensor]:
  """MNIST from the four IDX files in directory `path` (train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-...).

  Returns (X_train, Y_train, X_test, Y_test): uint8 images of shape (N, 1, 28, 28) and uint8 labels of shape (N,).
  """
  d = os.fspath(path)
  if not os.path.isdir(d):
    raise DatasetError(f"MNIST directory {d} does not exist")
  out = []
  for split in ("train", "t10k"):
    images, labels = read_idx(_find(d, f"{split}-images-idx3-ubyte")), read_idx(_find(d, f"{split}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
      raise DatasetError(f"{split}: images {images.shape} and labels {labels.shape} do not pair up")
    out += [Tensor(images.reshape(-1, 1, *images.shape[1:]).astype(np.uint8)), Tensor(labels.astype(np.uint8))]
  return out[0], out[1], out[2], out[3]


DIGITS_TEST_SIZE = 360  # 20% of the 1797 images
DIGITS_SEED = 1337


def digits_numpy() -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The scikit-learn handwritten digits as numpy arrays: (X_train, Y_train, X_test, Y_test), see `digits`."""
  try:
    from sklearn.datasets import load_digits
  except ImportError:
    raise ImportError("the digits dataset ships with scikit-learn: pip install 'tiny-nn[datasets]' (or scikit-learn)") from None
  data = load_digits()
  x = (data.images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
  y = data.target.astype(np.int32)
  order = np.random.RandomState(DIGITS_SEED).permutation(len(x))
  test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
  return x[train], y[train], x[test], y[test]


def digits() -> Tuple[Tensor, Tensor, Tensor, Tensor]:
  """The real handwritten digits set bundled with scikit-learn (1797 8x8 images of 0-9), with a fixed train/test split.

  Returns (X_train, Y_train, X_test, Y_test): float32 images in [0, 1] of shape (N, 1, 8, 8) and int32 labels;
  1437 training and 360 test images, split by a fixed seeded permutation (the same on every machine).
  """
  xtr, ytr, xte, yte = digits_numpy()
  return Tensor(xtr), Tensor(ytr), Tensor(xte), Tensor(yte)
