"""The thread pool's fallback to Python threads is not silent: one warning with the reason, and a note for `tiny doctor`."""
from __future__ import annotations

import pytest

import tiny_clang.compiler as compiler
import tiny_clang.plugin as plugin
import tiny_clang.pool as pool


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
  # the pool is process-wide: build a new one for the test and put the real one back afterwards
  monkeypatch.setattr(pool, "_pool", None)
  monkeypatch.setattr(pool, "fallback_reason", None)


def test_fallback_warns_once_and_records_why(fresh_pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(compiler, "find_cc", lambda: None)
  with pytest.warns(RuntimeWarning, match="native thread pool could not be built.*no C compiler"):
    p = pool.get_pool()
  assert isinstance(p, pool.PyPool)
  assert pool.fallback_reason is not None and "no C compiler" in pool.fallback_reason
  assert pool.get_pool() is p   # built once: no second warning, the same pool
  notes = plugin.doctor_notes()
  assert len(notes) == 1 and "Python threads" in notes[0] and "no C compiler" in notes[0]


def test_native_pool_note(fresh_pool: None) -> None:
  if compiler.find_cc() is None:
    pytest.skip("no C compiler here")
  assert plugin.doctor_notes() == [f"thread pool: native, {pool.num_threads()} threads"]
  assert pool.fallback_reason is None


def test_pool_builds_in_background(fresh_pool: None, monkeypatch: pytest.MonkeyPatch) -> None:
  """Making a CLANG/LLVM device starts the pool's build on a daemon thread (its compile overlaps the first kernels')."""
  import threading
  if compiler.find_cc() is None:
    pytest.skip("no C compiler here")
  # the build is held until the thread has been seen: with a warm compile cache it could finish before we look
  release, real_get_pool = threading.Event(), pool.get_pool
  monkeypatch.setattr(pool, "get_pool", lambda: release.wait(60) and real_get_pool())
  pool.build_in_background()
  builders = [t for t in threading.enumerate() if t.name == "tiny-clang-pool-build"]
  release.set()
  assert builders and all(t.daemon for t in builders)
  for t in builders:
    t.join(timeout=120)
  monkeypatch.setattr(pool, "get_pool", real_get_pool)
  assert isinstance(pool._pool, pool.NativePool) and pool.get_pool() is pool._pool
  pool.build_in_background()   # built: nothing more to start
  assert not [t for t in threading.enumerate() if t.name == "tiny-clang-pool-build" and t.is_alive()]
