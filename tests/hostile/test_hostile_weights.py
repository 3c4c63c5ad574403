"""The hostile corpus (weight_files.CASES) against tiny_nn.state's loaders.

Each hostile file is refused with a WeightFileError that names the file and the field at fault, or (a legal file built to
blow up a naive loader) loads within its time and memory bounds; no file may change tiny's own objects (dtypes, the
loader's functions). The valid seeds the fuzzer starts from load bit-exactly, and torch reads them the same way.
"""
from __future__ import annotations

import time
import tracemalloc
import types
from typing import Any, Dict, Iterator, List

import numpy as np
import pytest

import tiny_nn.state as state
from tiny.dtype import DType, dtypes
from tiny.tensor import Tensor
from tiny_nn.state import WeightFileError, gguf_load, safe_load, torch_load

from .weight_files import CASES, SEEDS, TensorSpec, Case, p_state_dict, pth_legacy, pth_zip, realize

EXT = {"safetensors": ".safetensors", "pth": ".pth", "pth-legacy": ".pth", "gguf": ".gguf"}


def load(fmt: str, fn: Any, **kwargs: Any) -> Any:
  """The loader of `fmt` (for GGUF, the tensors only)."""
  if fmt == "safetensors":
    return safe_load(fn)
  if fmt == "gguf":
    return gguf_load(fn)[1]
  return torch_load(fn, **kwargs)


def _dtype_objects() -> List[DType]:
  return [v for v in vars(dtypes).values() if isinstance(v, DType)]


def _functions() -> Iterator[types.FunctionType]:
  return (f for f in vars(state).values() if isinstance(f, types.FunctionType))


def _snapshot() -> Dict[Any, Any]:
  """Everything a pickle BUILD could write into: tiny's dtype objects and the loader module's functions and classes."""
  out: Dict[Any, Any] = {("dtype", id(d)): dict(vars(d)) for d in _dtype_objects()}
  for f in _functions():
    out[("fn", f.__name__)] = (dict(vars(f)), f.__defaults__, f.__kwdefaults__, f.__qualname__)
  for name, obj in vars(state).items():
    if isinstance(obj, type) and obj.__module__ == state.__name__:
      out[("cls", name)] = dict(vars(obj))
  return out


@pytest.fixture
def restore_globals() -> Iterator[None]:
  """Puts corrupted dtypes and functions back, so a failing case cannot break the tests after it."""
  dts = [(d, dict(vars(d))) for d in _dtype_objects()]
  fns = [(f, dict(vars(f)), f.__defaults__, f.__kwdefaults__, f.__qualname__) for f in _functions()]
  yield
  for d, saved in dts:
    vars(d).clear()
    vars(d).update(saved)
  for f, fdict, defaults, kwdefaults, qualname in fns:
    vars(f).clear()
    vars(f).update(fdict)
    f.__defaults__, f.__kwdefaults__, f.__qualname__ = defaults, kwdefaults, qualname


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_file(tmp_path, case: Case, restore_globals):
  fn = tmp_path / f"{case.name}{EXT[case.fmt]}"
  fn.write_bytes(case.build())
  before = _snapshot()
  if case.max_peak_mib is not None:
    tracemalloc.start()
  start, peak = time.process_time(), 0  # CPU time: other processes on the machine do not count against the file
  try:
    if case.loads is None:
      with pytest.raises(WeightFileError, match=case.match) as info:
        load(case.fmt, fn, **dict(case.kwargs))
      assert str(fn) in str(info.value), f"the message does not name the file: {info.value}"
    else:
      case.loads(load(case.fmt, fn, **dict(case.kwargs)))
  finally:
    elapsed = time.process_time() - start
    if case.max_peak_mib is not None:
      peak = tracemalloc.get_traced_memory()[1]
      tracemalloc.stop()
  assert dtypes.float32.itemsize == 4 and dtypes.float.itemsize == 4
  assert _snapshot() == before, "loading the file changed tiny's own objects"
  assert elapsed < case.max_seconds, f"took {elapsed:.1f}s"
  if case.max_peak_mib is not None:
    assert peak < case.max_peak_mib * 2**20, f"allocated {peak / 2**20:.0f} MiB"


def test_hostile_build_leaves_later_loads_intact(tmp_path, restore_globals):
  # the reported attack: after a BUILD on torch.FloatStorage, float32 math must still use 4-byte elements
  bad = next(c for c in CASES if c.name == "zip_build_on_storage_type")
  (tmp_path / "bad.pth").write_bytes(bad.build())
  with pytest.raises(WeightFileError):
    torch_load(tmp_path / "bad.pth")
  seed = SEEDS["pth"]()
  (tmp_path / "good.pth").write_bytes(seed.data)
  np.testing.assert_array_equal(realize(torch_load(tmp_path / "good.pth")["w"]), seed.expect["w"])
  x = np.arange(4096, dtype=np.float32)
  np.testing.assert_array_equal((Tensor(x) * 2).numpy(), x * 2)


def test_pickle_limit_is_configurable(tmp_path):
  fn = tmp_path / "big_key.pth"
  fn.write_bytes(pth_zip(p_state_dict({"w" * 5000: TensorSpec("0", "FloatStorage", 1, 0, (1,), (1,))}, metadata=False), {"0": bytes(4)}))
  with pytest.raises(WeightFileError, match="limit"):
    torch_load(fn, max_pickle_bytes=4096)
  assert list(torch_load(fn)) == ["w" * 5000]  # far under the default


def test_expanded_view_limit_is_configurable(tmp_path):
  fn = tmp_path / "expand.pth"
  spec = TensorSpec("0", "FloatStorage", 1, 0, (1 << 12,), (0,))
  fn.write_bytes(pth_legacy(p_state_dict({"w": spec}, legacy=True, metadata=False), [("0", 1, np.float32(3).tobytes())]))
  np.testing.assert_array_equal(realize(torch_load(fn)["w"]), np.full(1 << 12, 3, np.float32))
  with pytest.raises(WeightFileError, match="'w'.*elements"):
    torch_load(fn, max_expanded_bytes=1024)


@pytest.mark.parametrize("fmt", list(SEEDS))
def test_seed_loads_bit_exact(tmp_path, fmt):
  seed = SEEDS[fmt]()
  fn = tmp_path / f"seed{EXT[fmt]}"
  fn.write_bytes(seed.data)
  out = load(fmt, fn)
  assert set(out) == set(seed.expect)
  for k, want in seed.expect.items():
    got = realize(out[k])
    assert got.shape == want.shape and got.dtype.itemsize == want.dtype.itemsize, k
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), k


@pytest.mark.parametrize("fmt", ["pth", "pth-legacy"])
def test_seed_is_what_torch_reads(tmp_path, fmt):
  # the hand-written checkpoints are real torch checkpoints: torch's own (weights-only) loader agrees with the expected arrays
  torch = pytest.importorskip("torch")
  seed = SEEDS[fmt]()
  fn = tmp_path / f"seed{EXT[fmt]}"
  fn.write_bytes(seed.data)
  ref = torch.load(fn, weights_only=True)
  assert set(ref) == set(seed.expect)
  for k, want in seed.expect.items():
    np.testing.assert_array_equal(ref[k].detach().numpy(), want, err_msg=k)
