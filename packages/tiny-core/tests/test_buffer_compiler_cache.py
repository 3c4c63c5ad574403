"""Compiler disk cache: hits, corrupt and stale entries, CACHELEVEL=0, concurrent processes; CompileError."""
import os
import pickle
import sqlite3
import subprocess
import sys
import uuid
import warnings

import numpy as np
import pytest

import tiny.helpers as helpers
from tiny.device import CompileError, Compiler


class CountingCompiler(Compiler):
  """A 'compiler' whose binary is a reversible transform of the source, counting real compilations."""

  def __init__(self, cachekey):
    super().__init__(cachekey)
    self.calls = 0

  def compile(self, src):
    self.calls += 1
    return src[::-1].encode()


@pytest.fixture
def cachedb(tmp_path, monkeypatch):
  path = str(tmp_path / "cache.db")
  monkeypatch.setattr(helpers, "CACHEDB", path)
  monkeypatch.setattr(helpers, "CACHELEVEL", 2)
  monkeypatch.delenv("DISABLE_COMPILER_CACHE", raising=False)
  return path


def _table_rows(path):
  conn = sqlite3.connect(path)
  tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
  return conn, tables


def test_compile_cached_hits_the_disk_cache(cachedb):
  key = f"test_{uuid.uuid4().hex}"
  c1, c2 = CountingCompiler(key), CountingCompiler(key)
  assert c1.compile_cached("int main(){}") == b"}{)(niam tni"
  assert c2.compile_cached("int main(){}") == b"}{)(niam tni"  # a fresh compiler object: served from disk
  assert (c1.calls, c2.calls) == (1, 0)
  assert c2.compile_cached("other") == b"rehto" and c2.calls == 1
  # the table name carries the cache format version, so a format change never reads old rows
  conn, tables = _table_rows(cachedb)
  assert any(t.startswith(key) and t.endswith(f"_v{helpers.DISKCACHE_VERSION}") for t in tables)


@pytest.mark.parametrize("bad", [b"\x80\x04garbage-not-a-pickle", pickle.dumps({"stale": "not bytes"})])
def test_corrupt_or_stale_entry_is_ignored_and_rebuilt(cachedb, bad):
  key = f"test_{uuid.uuid4().hex}"
  c = CountingCompiler(key)
  c.compile_cached("abc")
  conn, tables = _table_rows(cachedb)
  (table,) = [t for t in tables if t.startswith(key)]
  conn.execute(f'UPDATE "{table}" SET val=?', (bad,))
  conn.commit()
  c2 = CountingCompiler(key)
  assert c2.compile_cached("abc") == b"cba" and c2.calls == 1
  # the rebuilt entry was written back and is good again
  c3 = CountingCompiler(key)
  assert c3.compile_cached("abc") == b"cba" and c3.calls == 0


def test_cachelevel_zero_and_no_cachekey_always_compile(cachedb, monkeypatch):
  key = f"test_{uuid.uuid4().hex}"
  monkeypatch.setattr(helpers, "CACHELEVEL", 0)
  c = CountingCompiler(key)
  c.compile_cached("x")
  c.compile_cached("x")
  assert c.calls == 2
  monkeypatch.setattr(helpers, "CACHELEVEL", 2)
  n = CountingCompiler(None)
  n.compile_cached("x")
  n.compile_cached("x")
  assert n.calls == 2


def test_unwritable_cache_does_not_break_compilation(tmp_path, monkeypatch):
  blocker = tmp_path / "file"
  blocker.write_text("")
  monkeypatch.setattr(helpers, "CACHEDB", str(blocker / "sub" / "cache.db"))  # parent is a file: cannot be created
  c = CountingCompiler(f"test_{uuid.uuid4().hex}")
  assert c.compile_cached("qr") == b"rq" and c.calls == 1
  monkeypatch.setattr(helpers, "_cache_db", lambda: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")))
  assert c.compile_cached("qr") == b"rq" and c.calls == 2


WORKER = """
import sys, tiny.helpers as h
h.CACHEDB = sys.argv[1]
from tiny.device import Compiler
class C(Compiler):
  def compile(self, src): return (src * 3).encode()
c = C(sys.argv[2])
for i in range(40):
  assert c.compile_cached(f"kernel {i % 10}") == (f"kernel {i % 10}" * 3).encode()
print("ok")
"""


def test_concurrent_processes_share_the_cache(cachedb):
  key = f"test_{uuid.uuid4().hex}"
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, cachedb, key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(3)]
  for p in procs:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "ok"
  c = CountingCompiler(key)
  assert c.compile_cached("kernel 3") == b"kernel 3kernel 3kernel 3" and c.calls == 0


THREADS_WORKER = """
import sys, threading, tiny.helpers as h
h.CACHEDB = sys.argv[1]
# the process's first cache call comes from another thread (a compile pool, a user's worker thread)
t = threading.Thread(target=lambda: h.diskcache_put("t", "from_thread", b"a"))
t.start(); t.join()
h.diskcache_put("t", "from_main", b"b")
print(h.diskcache_get("t", "from_thread"), h.diskcache_get("t", "from_main"))
"""


def test_cache_works_from_every_thread(tmp_path):
  # regression: the connection was tied to the thread that opened it, so the main thread's gets and puts failed
  # quietly and every compile afterwards was a miss
  out = subprocess.run([sys.executable, "-c", THREADS_WORKER, str(tmp_path / "cache.db")], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == "b'a' b'b'"


def test_compile_error_carries_source_and_message():
  src = "int f() {\n  return x;\n}"
  e = CompileError("error: use of undeclared identifier 'x'", src)
  assert isinstance(e, RuntimeError)
  assert e.src == src and e.compiler_msg == "error: use of undeclared identifier 'x'"
  msg = str(e)
  assert "undeclared identifier" in msg
  assert "   2 |   return x;" in msg and "   1 | int f() {" in msg


def test_default_compiler_is_identity_and_env_disables_cache(monkeypatch):
  assert Compiler().compile("abc") == b"abc"
  monkeypatch.setenv("DISABLE_COMPILER_CACHE", "1")
  assert Compiler("somekey").cachekey is None


# *** integrity: checksummed plain values, damaged or planted entries, damaged database files ***

@pytest.fixture
def fresh_warning(monkeypatch):
  monkeypatch.setattr(helpers, "_db_warned", False)


def _forget_connection(path):
  # what a new process would see: no open connection, everything checkpointed into the main file
  conn = helpers._db_connections.pop((os.getpid(), path), None)
  if conn is not None:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


class _Planted:
  """Unpickling this creates `path`: evidence that a cached value was unpickled."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


def test_values_are_bytes_or_json_never_pickles(cachedb):
  helpers.diskcache_put("plain", "k", {"opts": [["UPCAST", 0, 4], ["LOCAL", 1, None]], "t": 1.5, "ok": True})
  assert helpers.diskcache_get("plain", "k") == {"opts": [["UPCAST", 0, 4], ["LOCAL", 1, None]], "t": 1.5, "ok": True}
  helpers.diskcache_put("plain2", {"a": "x", "b": 3}, b"\x00\xffbinary")
  assert helpers.diskcache_get("plain2", {"a": "x", "b": 3}) == b"\x00\xffbinary"
  with pytest.raises(TypeError, match="bytes or JSON"):
    helpers.diskcache_put("plain", "obj", object())
  with pytest.raises(TypeError, match="key"):
    helpers.diskcache_put("plain", {"val": 1}, b"")


@pytest.mark.parametrize("kind", ["bytes", "json"])
def test_planted_pickle_is_never_executed(cachedb, tmp_path, kind):
  marker = tmp_path / "unpickled"
  key = f"test_{uuid.uuid4().hex}"
  c = CountingCompiler(key)
  c.compile_cached("abc")
  evil = pickle.dumps(_Planted(str(marker)))
  conn, tables = _table_rows(cachedb)
  (table,) = [t for t in tables if t.startswith(key)]
  # the attacker can even write a matching checksum: the value is still never unpickled
  sha = helpers._cache_checksum(table, {"key": "abc"}, kind, evil)
  conn.execute(f'UPDATE "{table}" SET kind=?, val=?, sha=?', (kind, evil, sha))
  conn.commit()
  got = CountingCompiler(key).compile_cached("abc")
  assert not marker.exists()
  # as bytes it is only data handed back (the cache is as trusted as its file permissions); as json it fails and is rebuilt
  assert got == (evil if kind == "bytes" else b"cba")
  # the same for the BEAM cache's JSON values
  helpers.diskcache_put("beam_search", "k", [["UPCAST", 0, 4]])
  (btable,) = [t for t in _table_rows(cachedb)[1] if t.startswith("beam_search")]
  conn.execute(f'UPDATE "{btable}" SET val=?', (evil,))
  conn.commit()
  assert helpers.diskcache_get("beam_search", "k") is None and not marker.exists()


def test_garbage_database_is_recreated_with_one_warning(cachedb, fresh_warning):
  with open(cachedb, "wb") as f:
    f.write(os.urandom(8192))
  key = f"test_{uuid.uuid4().hex}"
  c = CountingCompiler(key)
  with pytest.warns(RuntimeWarning, match="damaged") as rec:
    assert c.compile_cached("abc") == b"cba" and c.calls == 1
  assert len([w for w in rec if "damaged" in str(w.message)]) == 1
  assert os.path.exists(cachedb + ".corrupt")
  # caching works again: a fresh compiler is served from the new database
  c2 = CountingCompiler(key)
  assert c2.compile_cached("abc") == b"cba" and c2.calls == 0
  # damaged again in the same process: recreated again, but warned only once per process
  _forget_connection(cachedb)
  with open(cachedb, "wb") as f:
    f.write(b"not a database" * 500)
  with warnings.catch_warnings(record=True) as rec2:
    warnings.simplefilter("always")
    c3 = CountingCompiler(key)
    assert c3.compile_cached("abc") == b"cba" and c3.calls == 1
  assert [w for w in rec2 if "damaged" in str(w.message)] == []
  assert CountingCompiler(key).compile_cached("abc") == b"cba"


def test_truncated_database_is_recreated(cachedb, fresh_warning):
  key = f"test_{uuid.uuid4().hex}"
  c = CountingCompiler(key)
  srcs = [f"kernel {i} " + "x" * 2000 for i in range(100)]
  for s in srcs:
    c.compile_cached(s)
  _forget_connection(cachedb)
  os.truncate(cachedb, os.path.getsize(cachedb) // 2)
  c2 = CountingCompiler(key)
  with pytest.warns(RuntimeWarning, match="damaged"):
    for s in srcs:
      assert c2.compile_cached(s) == s[::-1].encode()
  assert 0 < c2.calls <= len(srcs)
  c3 = CountingCompiler(key)
  for s in srcs:
    assert c3.compile_cached(s) == s[::-1].encode()
  assert c3.calls == 0


def test_concurrent_processes_recover_a_damaged_database(cachedb):
  with open(cachedb, "wb") as f:
    f.write(os.urandom(16384))
  key = f"test_{uuid.uuid4().hex}"
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, cachedb, key], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(3)]
  for p in procs:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert out.strip() == "ok" and err.count("is damaged") <= 1
  c = CountingCompiler(key)
  assert c.compile_cached("kernel 3") == b"kernel 3kernel 3kernel 3" and c.calls == 0


CLANG_RUN = """
import numpy as np
from tiny import Tensor
x = Tensor(np.arange(64, dtype=np.float32), device="CLANG")
print((x * 3 + 1).sum().item())
"""


def test_flipped_bytes_in_a_cached_clang_binary_are_rebuilt(tmp_path):
  pytest.importorskip("tiny_clang")
  from tiny_clang.compiler import find_cc
  if find_cc() is None:
    pytest.skip("no C compiler")
  db = str(tmp_path / "cache.db")
  env = {**os.environ, "CACHEDB": db, "CACHELEVEL": "2"}
  env.pop("DISABLE_COMPILER_CACHE", None)
  want = float(np.sum(np.arange(64, dtype=np.float32) * 3 + 1))

  def run():
    # a subprocess: loading a damaged binary could kill the process (SIGSEGV, SIGILL, SIGBUS)
    p = subprocess.run([sys.executable, "-c", CLANG_RUN], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-2000:]}"
    assert float(p.stdout.strip().splitlines()[-1]) == want
  run()
  conn, tables = _table_rows(db)
  flipped = {}
  for t in tables:
    if not t.startswith("compile_clang"):
      continue
    for rowid, val in conn.execute(f'SELECT rowid, val FROM "{t}"').fetchall():
      bad = bytearray(val)
      for i in range(len(bad) // 4, len(bad) // 2):  # the middle of the shared object: code and tables
        bad[i] ^= 0xFF
      conn.execute(f'UPDATE "{t}" SET val=? WHERE rowid=?', (bytes(bad), rowid))
      flipped[(t, rowid)] = bytes(bad)
  conn.commit()
  assert flipped, "the run should have cached at least one CLANG binary"
  run()
  # every damaged entry was replaced by a good build
  for (t, rowid), bad in flipped.items():
    row = conn.execute(f'SELECT val FROM "{t}" WHERE rowid=?', (rowid,)).fetchone()
    assert row is None or row[0] != bad
  assert conn.execute(f'SELECT count(*) FROM "{next(iter(flipped))[0]}"').fetchone()[0] > 0
