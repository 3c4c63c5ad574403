"""safe_save / safe_load on the same path again and again: a reload returns what was saved last, never stale bytes."""
import os

import numpy as np
import pytest

from tiny import Tensor
from tiny.registry import Device
from tiny_nn.state import WeightFileError, safe_load, safe_save


def _weights(seed):
  rng = np.random.default_rng(seed)
  return {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.integers(-9, 9, size=5).astype(np.int32)}


def _save(d, path):
  safe_save({k: Tensor(v) for k, v in d.items()}, path)


def test_reload_after_overwrite_returns_the_new_weights(tmp_path):
  path = str(tmp_path / "model.safetensors")
  first, second = _weights(0), _weights(1)
  _save(first, path)
  alive = safe_load(path)  # kept alive: its file mapping stays open
  np.testing.assert_array_equal(alive["w"].numpy(), first["w"])
  _save(second, path)
  again = safe_load(path)
  for k in second:
    np.testing.assert_array_equal(again[k].numpy(), second[k])
  # the tensors loaded before still hold the weights they were loaded from
  np.testing.assert_array_equal(alive["w"].numpy(), first["w"])


def test_save_best_reload_loop(tmp_path):
  path = str(tmp_path / "best.safetensors")
  loaded = []
  for step in range(4):
    w = _weights(step)
    _save(w, path)
    loaded.append(safe_load(path))  # every loaded dict stays alive through the loop
    for k in w:
      np.testing.assert_array_equal(loaded[-1][k].numpy(), w[k])
  # a different size each time would also work: save a bigger file over the same path
  big = {"w": np.arange(64, dtype=np.float32)}
  _save(big, path)
  np.testing.assert_array_equal(safe_load(path)["w"].numpy(), big["w"])


def test_save_loaded_tensors_back_to_their_own_file(tmp_path):
  path = str(tmp_path / "model.safetensors")
  w = _weights(2)
  _save(w, path)
  loaded = safe_load(path)
  safe_save({"w": loaded["w"], "b": loaded["b"], "w2": loaded["w"].to(Device.DEFAULT) * 2}, path)  # reads the old file while replacing it
  again = safe_load(path)
  np.testing.assert_array_equal(again["w"].numpy(), w["w"])
  np.testing.assert_array_equal(again["b"].numpy(), w["b"])
  np.testing.assert_allclose(again["w2"].numpy(), w["w"] * 2)


def test_load_leaves_the_file_untouched_and_works_read_only(tmp_path, monkeypatch):
  path = str(tmp_path / "ro.safetensors")
  w = _weights(3)
  _save(w, path)
  write_opens, real_open = [], os.open

  def spy(p, flags, *args):
    # root ignores the permission bits, so also check that nothing asks for write access
    if os.fspath(p) == path and flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
      write_opens.append(flags)
    return real_open(p, flags, *args)
  monkeypatch.setattr(os, "open", spy)
  with open(path, "rb") as f:
    content = f.read()
  os.chmod(path, 0o444)
  try:
    before = os.stat(path)
    loaded = safe_load(path)
    for k in w:
      np.testing.assert_array_equal(loaded[k].numpy(), w[k])
    del loaded
    after = os.stat(path)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size) and write_opens == []
    with open(path, "rb") as f:
      assert f.read() == content
  finally:
    os.chmod(path, 0o644)


def test_truncated_checkpoint_is_not_extended(tmp_path):
  path = str(tmp_path / "cut.safetensors")
  _save(_weights(4), path)
  size = os.path.getsize(path)
  os.truncate(path, size - 8)
  with pytest.raises(WeightFileError, match="truncated"):
    safe_load(path)
  assert os.path.getsize(path) == size - 8
