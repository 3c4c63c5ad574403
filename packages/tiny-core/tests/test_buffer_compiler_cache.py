"""Compiler disk cache: hits, corrupt and stale entries, CACHELEVEL=0, concurrent processes; CompileError."""
import pickle
import sqlite3
import subprocess
import sys
import uuid

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
