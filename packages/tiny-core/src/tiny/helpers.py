"""Small shared utilities: environment knobs, iteration helpers, counters, caching paths."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import operator
import os
import platform
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union

T = TypeVar("T")
U = TypeVar("U")

OSX = platform.system() == "Darwin"
CI = os.getenv("CI", "") != ""


def prod(x: Iterable[T]) -> Union[T, int]:
  """Product of an iterable; 1 for an empty one. Works on ints and symbolic nodes alike."""
  return functools.reduce(operator.mul, x, 1)


def dedup(x: Iterable[T]) -> List[T]:
  """Remove duplicates while keeping first-seen order."""
  return list(dict.fromkeys(x))


def argfix(*x: Any) -> Tuple[Any, ...]:
  """Accept both f(1, 2) and f((1, 2)) call styles."""
  if x and x[0].__class__ in (tuple, list):
    if len(x) != 1:
      raise ValueError(f"bad arg {x}: pass either one sequence or several values")
    return tuple(x[0])
  return x


def argsort(x: Sequence[Any]) -> List[int]:
  """Indices that sort x ascending."""
  return sorted(range(len(x)), key=x.__getitem__)


def all_same(items: Sequence[Any]) -> bool:
  """True when every element equals the first (vacuously true when empty)."""
  return all(x == items[0] for x in items)


def all_int(t: Sequence[Any]) -> bool:
  """True when every element is a plain int (not a symbolic node)."""
  return all(isinstance(s, int) for s in t)


def colored(st: str, color: Optional[str], background: bool = False) -> str:
  """Wrap st in an ANSI color escape (no-op when color is None)."""
  if color is None:
    return st
  colors = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
  code = 10 * background + 60 * (color.upper() == color) + 30 + colors.index(color.lower())
  return f"\u001b[{code}m{st}\u001b[0m"


def ansistrip(s: str) -> str:
  """Remove ANSI escapes."""
  import re
  return re.sub(r"\x1b\[(K|.*?m)", "", s)


def ansilen(s: str) -> int:
  """Printed length of s, ignoring ANSI escapes."""
  return len(ansistrip(s))


def make_pair(x: Union[int, Tuple[int, ...]], cnt: int = 2) -> Tuple[int, ...]:
  """Turn an int into a cnt-tuple; pass tuples through."""
  return (x,) * cnt if isinstance(x, int) else x


def flatten(items: Iterable[Iterable[T]]) -> List[T]:
  """Flatten one level of nesting."""
  return [item for sublist in items for item in sublist]


def fully_flatten(items: Any) -> List[Any]:
  """Flatten arbitrarily nested lists/tuples."""
  if hasattr(items, "__len__") and hasattr(items, "__getitem__") and not isinstance(items, (str, bytes)):
    return [x for it in items for x in fully_flatten(it)]
  return [items]


def strip_parens(fst: str) -> str:
  """Drop one pair of outer parentheses when they enclose the whole string."""
  if fst[:1] != "(" or fst[-1:] != ")":
    return fst
  depth = 0
  for i, c in enumerate(fst):
    depth += (c == "(") - (c == ")")
    if depth == 0 and i != len(fst) - 1:
      return fst
  return fst[1:-1]


def round_up(num: int, amt: int) -> int:
  """Round num up to a multiple of amt."""
  return (num + amt - 1) // amt * amt


def merge_dicts(ds: Iterable[Dict[T, U]]) -> Dict[T, U]:
  """Merge dicts, raising if two of them disagree on a key."""
  ds = [d for d in ds if d]
  if len(ds) <= 1:
    return dict(ds[0]) if ds else {}   # nothing can disagree: the scheduler's usual case (no symbolic variables)
  kvs = set((k, v) for d in ds for k, v in d.items())
  keys = set(k for k, _ in kvs)
  if len(kvs) != len(keys):
    raise ValueError(f"cannot merge, {kvs} contains different values for the same key")
  return {k: v for d in ds for k, v in d.items()}


def partition(lst: Iterable[T], fxn: Callable[[T], bool]) -> Tuple[List[T], List[T]]:
  """Split lst into (items where fxn is true, the rest)."""
  a: List[T] = []
  b: List[T] = []
  for s in lst:
    (a if fxn(s) else b).append(s)
  return a, b


def get_shape(x: Any) -> Tuple[int, ...]:
  """Shape of a nested list; raises ValueError when ragged."""
  if not isinstance(x, (list, tuple)):
    return ()
  subs = [get_shape(xi) for xi in x]
  if not all_same(subs):
    raise ValueError(f"inhomogeneous shape from {x}")
  return (len(subs),) + (subs[0] if subs else ())


def getenv(key: str, default: Any = 0) -> Any:
  """Read an environment variable, converted to the type of default."""
  return type(default)(os.getenv(key, default))


def temp(x: str) -> str:
  """A path inside the system temp directory."""
  return os.path.join(tempfile.gettempdir(), x)


class ContextVar:
  """A process-wide knob read once from the environment and overridable with Context."""

  _cache: ClassVar[Dict[str, "ContextVar"]] = {}
  value: Any
  key: str

  def __new__(cls, key: str, default_value: Any) -> "ContextVar":
    if key in ContextVar._cache:
      return ContextVar._cache[key]
    instance = ContextVar._cache[key] = super().__new__(cls)
    instance.value, instance.key = getenv(key, default_value), key
    return instance

  def __bool__(self) -> bool:
    return bool(self.value)

  def __ge__(self, x: Any) -> bool:
    return self.value >= x

  def __gt__(self, x: Any) -> bool:
    return self.value > x

  def __lt__(self, x: Any) -> bool:
    return self.value < x

  def __le__(self, x: Any) -> bool:
    return self.value <= x

  def __eq__(self, x: Any) -> bool:  # type: ignore[override]
    return self.value == x

  def __hash__(self) -> int:
    return hash(self.key)

  def __repr__(self) -> str:
    return f"ContextVar({self.key}={self.value!r})"


class Context(contextlib.ContextDecorator):
  """Temporarily override ContextVars: `with Context(DEBUG=2): ...`."""

  stack: ClassVar[List[Dict[str, Any]]] = [{}]

  def __init__(self, **kwargs: Any) -> None:
    self.kwargs = kwargs

  def __enter__(self) -> None:
    Context.stack[-1] = {k: o.value for k, o in ContextVar._cache.items()}
    for k, v in self.kwargs.items():
      ContextVar(k, v).value = v
    Context.stack.append(self.kwargs)

  def __exit__(self, *args: Any) -> None:
    for k in Context.stack.pop():
      ContextVar._cache[k].value = Context.stack[-1].get(k, ContextVar._cache[k].value)


DEBUG, IMAGE, BEAM, NOOPT, JIT = ContextVar("DEBUG", 0), ContextVar("IMAGE", 0), ContextVar("BEAM", 0), ContextVar("NOOPT", 0), ContextVar("JIT", 1)
WINO, THREEFRY, CAPTURING = ContextVar("WINO", 0), ContextVar("THREEFRY", 0), ContextVar("CAPTURING", 1)
GRAPH, MULTIOUTPUT, TRANSCENDENTAL = ContextVar("GRAPH", 0), ContextVar("MULTIOUTPUT", 1), ContextVar("TRANSCENDENTAL", 1)
USE_TC, TC_OPT, SPLIT_REDUCEOP = ContextVar("TC", 1), ContextVar("TC_OPT", 0), ContextVar("SPLIT_REDUCEOP", 1)
# ROW_FUSION=0: softmax/layernorm-style graphs get a kernel per reduce instead of one row kernel (see engine/row_fusion.py)
ROW_FUSION = ContextVar("ROW_FUSION", 1)
# CHECK_INDEX=1: realize integer Tensor indices (indexing, gather, one_hot, Embedding) and raise IndexError on the host
# for out-of-range values; off by default because it costs a device sync per indexing op
CHECK_INDEX = ContextVar("CHECK_INDEX", 0)
# PROFILE=1: HCQ devices time every kernel and copy on the device and write a Chrome trace at exit (tiny.runtime.hcq)
PROFILE = ContextVar("PROFILE", 0)


@dataclass(frozen=True)
class Metadata:
  """Where a kernel came from: the Tensor method name and whether it is part of a backward pass."""

  name: str
  caller: str = ""
  backward: bool = False

  def __hash__(self) -> int:
    return hash(self.name)

  def __repr__(self) -> str:
    return str(self) + (f" - {self.caller}" if self.caller else "")

  def __str__(self) -> str:
    return self.name + (" bw" if self.backward else "")


class _Counters:
  """Process-wide counters of work done: kernels launched, ops, bytes moved, time, memory in use.

  One instance (GlobalCounters) with slots, not a class with class attributes: every eager op bumps several counters,
  and a store to a class attribute costs about four times a slot's (it also invalidates the type's attribute caches)."""

  __slots__ = ("global_ops", "global_mem", "time_sum_s", "kernel_count", "mem_used", "mem_peak")

  def __init__(self) -> None:
    self.global_ops, self.global_mem, self.time_sum_s, self.kernel_count = 0, 0, 0.0, 0
    self.mem_used = 0  # not reset: it tracks live allocations
    self.mem_peak = 0

  def reset(self) -> None:
    """Zero the per-run counters (mem_used is kept: it is live state)."""
    self.global_ops, self.global_mem, self.time_sum_s, self.kernel_count = 0, 0, 0.0, 0
    self.mem_peak = self.mem_used


GlobalCounters = _Counters()


class Timing(contextlib.ContextDecorator):
  """Print the wall time of a block: `with Timing("load: "): ...`."""

  def __init__(self, prefix: str = "", on_exit: Optional[Callable[[int], str]] = None, enabled: bool = True) -> None:
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

  def __enter__(self) -> None:
    self.st = time.perf_counter_ns()

  def __exit__(self, *exc: Any) -> None:
    self.et = time.perf_counter_ns() - self.st
    if self.enabled:
      print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


def _cache_dir() -> str:
  return getenv("XDG_CACHE_HOME", os.path.expanduser("~/Library/Caches" if OSX else "~/.cache"))


CACHEDB: str = getenv("CACHEDB", os.path.abspath(os.path.join(_cache_dir(), "tiny", "cache.db")))
CACHELEVEL = getenv("CACHELEVEL", 2)


def to_function_name(s: str) -> str:
  """Turn a colored kernel name into a valid C identifier."""
  return "".join(c if c.isalnum() or c == "_" else f"{ord(c):02X}" for c in ansistrip(s))


def fetch(url: str, name: Optional[str] = None, allow_caching: bool = not getenv("DISABLE_HTTP_CACHE")) -> "os.PathLike[str]":
  """Download url into the user cache (or return the cached copy). file:// and plain paths are read in place."""
  import pathlib
  if url.startswith(("/", ".")) or url.startswith("file://"):
    return pathlib.Path(url.removeprefix("file://"))
  fp = pathlib.Path(_cache_dir()) / "tiny" / "downloads" / (name or hashlib.md5(url.encode()).hexdigest())
  if not fp.is_file() or not allow_caching:
    fp.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=10) as r:
      if r.status != 200:
        raise RuntimeError(f"fetch of {url} failed with status {r.status}")
      data = r.read()
    tmp = fp.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(fp)
  return fp


def tqdm(iterable: Optional[Iterable[T]] = None, *args: Any, **kwargs: Any) -> Any:
  """A progress bar from the tqdm package, quiet when it is not installed."""
  try:
    from tqdm import tqdm as _tqdm
  except ImportError:
    return _NoBar(iterable, **kwargs)
  return _tqdm(iterable, *args, **kwargs)


def progress_bar(total: int, desc: str, unit: str = "it") -> Any:
  """A counting progress bar on stderr: tqdm's when it is installed, else one plain line rewritten in place."""
  try:
    from tqdm import tqdm as _tqdm
  except ImportError:
    return _LineBar(total, desc, unit)
  return _tqdm(total=total, desc=desc, unit=unit, leave=False)


class _LineBar:
  def __init__(self, total: int, desc: str, unit: str) -> None:
    self.n, self.total, self.desc, self.unit, self.st = 0, total, desc, unit, time.perf_counter()

  def update(self, n: int = 1) -> None:
    self.n += n
    sys.stderr.write(f"\r{self.desc}: {self.n}/{self.total} {self.unit}s, {time.perf_counter() - self.st:.1f}s")
    sys.stderr.flush()

  def close(self) -> None:
    sys.stderr.write("\r\033[K")
    sys.stderr.flush()


def trange(n: int, *args: Any, **kwargs: Any) -> Any:
  """tqdm(range(n))."""
  return tqdm(range(n), *args, **kwargs)


class _NoBar:
  def __init__(self, iterable: Optional[Iterable[Any]] = None, **kwargs: Any) -> None:
    self.iterable = iterable

  def __iter__(self) -> Iterator[Any]:
    return iter(self.iterable if self.iterable is not None else [])

  def update(self, n: int = 1) -> None:
    pass

  def set_description(self, *args: Any, **kwargs: Any) -> None:
    pass

  def close(self) -> None:
    pass

  def __enter__(self) -> "_NoBar":
    return self

  def __exit__(self, *args: Any) -> None:
    pass


def pretty_print(x: Any, rep: Callable[[Any], Any], srcfn: Callable[[Any], Any] = lambda x: x.src, cache: Optional[Dict[Any, Any]] = None,
                 d: int = 0) -> str:
  """Indented tree rendering of a DAG (shared nodes are numbered)."""
  def dfs(x: Any, cache: Dict[Any, Any]) -> None:
    for s in srcfn(x) or []:
      cache.setdefault(s, [len(cache), 0, False])[1] += 1
      if cache[s][1] == 1:
        dfs(s, cache)
  if cache is None:
    cache = {}
    dfs(x, cache)
  if (cx := cache.setdefault(x, [0, 0, False]))[2]:
    return f"{' ' * d} x{cx[0]}"
  cx[2], srcs = True, ("None" if srcfn(x) is None else "".join(f"\n{pretty_print(s, rep, srcfn, cache, d + 2)}," for s in srcfn(x)))
  return f"{' ' * d}{f'x{cx[0]}:=' * (cx[1] > 1)}{rep(x)}" % srcs






# *** raw memory views (used by allocators and runtimes built on ctypes) ***

def from_mv(mv: memoryview, to_type: Any = None) -> Any:
  """A ctypes array aliasing the bytes of a writable memoryview (no copy)."""
  import ctypes
  return ctypes.cast(ctypes.addressof((to_type or ctypes.c_char).from_buffer(mv)), ctypes.POINTER((to_type or ctypes.c_char) * len(mv))).contents


def flat_mv(mv: memoryview) -> memoryview:
  """The same bytes as a flat unsigned-byte memoryview."""
  return mv if len(mv) == 0 else mv.cast("B", shape=(mv.nbytes,))


# *** sqlite disk cache: versioned tables, WAL, checksummed plain values; a broken cache never breaks a run ***

# 2: a row is bytes or JSON text plus a sha256 (version 1 stored pickles, so a planted cache file could run code)
DISKCACHE_VERSION = 2
_db_connections: Dict[Tuple[int, str], Any] = {}
_db_file_ids: Dict[Tuple[int, str], Optional[Tuple[int, int]]] = {}
_db_warned = False
# SQLITE_CORRUPT, SQLITE_NOTADB: the file itself is damaged (unlike "locked" or "read-only", which pass)
_SQLITE_DAMAGED = (11, 26)


def _file_id(path: str) -> Optional[Tuple[int, int]]:
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_dev, st.st_ino


_cache_thread_lock = threading.RLock()


def _cache_db() -> Any:
  import sqlite3
  key = (os.getpid(), CACHEDB)
  if (conn := _db_connections.get(key)) is None:
    if CACHEDB != ":memory:":
      # the cache holds code that gets loaded: keep a new cache directory private to the user
      os.makedirs(os.path.dirname(CACHEDB) or ".", mode=0o700, exist_ok=True)
    # any thread may use it (under _cache_thread_lock): a connection tied to the thread that opened it made every other
    # thread's cache calls fail, which read as misses, so the cache silently stopped working
    conn = sqlite3.connect(CACHEDB, timeout=30, isolation_level=None, check_same_thread=False)
    _db_connections[key], _db_file_ids[key] = conn, _file_id(CACHEDB)
    with contextlib.suppress(sqlite3.OperationalError):
      conn.execute("PRAGMA journal_mode=WAL")  # a damaged file raises DatabaseError here, which _cache_run handles
      # no fsync per write (WAL stays consistent; a power cut may only lose the last entries, which get rebuilt): a first
      # call stores a binary per kernel, and an fsync each cost ~2 ms of its wall time, ~0.2 s for an MNIST step
      conn.execute("PRAGMA synchronous=NORMAL")
  return conn


def _is_damaged(e: BaseException) -> bool:
  import sqlite3
  if not isinstance(e, sqlite3.DatabaseError):
    return False
  code = getattr(e, "sqlite_errorcode", None)
  # Python < 3.11 has no error codes; there the damaged-file errors are the only bare DatabaseErrors
  return (code & 0xFF) in _SQLITE_DAMAGED if code is not None else type(e) is sqlite3.DatabaseError


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
  """An exclusive lock shared by all processes using CACHEDB (a no-op where flock or the lock file is unavailable)."""
  try:
    import fcntl
    f = open(CACHEDB + ".lock", "a")
  except (ImportError, OSError):
    yield  # without the lock two processes may both recreate the file: that costs cache entries, never correctness
    return
  with f:
    fcntl.flock(f, fcntl.LOCK_EX)
    yield


def _recreate_cache_db(e: BaseException) -> None:
  """Drop this process's connection to a damaged CACHEDB and move the file aside, so the next connection starts empty."""
  global _db_warned
  key = (os.getpid(), CACHEDB)
  conn, opened = _db_connections.pop(key, None), _db_file_ids.pop(key, None)
  if conn is not None:
    with contextlib.suppress(Exception):
      conn.close()
  if CACHEDB == ":memory:":
    return
  with _cache_lock():
    # another process may have replaced the damaged file already: only move the one this connection found broken
    now = _file_id(CACHEDB)
    if now is not None and (opened is None or now == opened):
      with contextlib.suppress(OSError):
        os.replace(CACHEDB, CACHEDB + ".corrupt")
      for ext in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(OSError):
          os.unlink(CACHEDB + ext)
  if not _db_warned:
    _db_warned = True
    import warnings
    warnings.warn(f"tiny: the disk cache {CACHEDB} is damaged ({e}); moved it to {CACHEDB}.corrupt and started a new one",
                  RuntimeWarning, stacklevel=4)


def _cache_run(fn: Callable[[Any], T]) -> Optional[T]:
  """fn(connection); a damaged database is recreated and fn retried once. None when the cache cannot be used.

  One connection per process serves every thread (made with check_same_thread=False), so calls are serialized here."""
  import sqlite3
  with _cache_thread_lock:
    for attempt in range(2):
      try:
        return fn(_cache_db())
      except (sqlite3.Error, OSError) as e:
        if attempt == 0 and _is_damaged(e):
          _recreate_cache_db(e)
          continue
        return None
  return None


def _cache_table(table: str) -> str:
  return f"{''.join(c if c.isalnum() or c == '_' else '_' for c in table)}_v{DISKCACHE_VERSION}"


_KEY_TYPES = {str: "text", bool: "integer", int: "integer", float: "numeric", bytes: "blob"}


def _cache_key(key: Any) -> Dict[str, Any]:
  key = {"key": key} if isinstance(key, (str, int)) else key
  if not isinstance(key, dict) or not key:
    raise TypeError(f"a disk cache key is a str, an int or a non-empty dict of them, got {type(key).__name__}")
  for k, v in key.items():
    if k in ("kind", "val", "sha") or not isinstance(k, str) or type(v) not in _KEY_TYPES:
      raise TypeError(f"disk cache key column {k!r}: names must be str other than kind/val/sha, values str/int/float/bool/bytes")
  return key


def _cache_checksum(tbl: str, key: Dict[str, Any], kind: str, val: bytes) -> str:
  # the key is part of the sum, so a row copied under another key fails too
  return hashlib.sha256(repr((tbl, tuple(key.items()), kind)).encode() + b"\0" + val).hexdigest()


def diskcache_get(table: str, key: Any) -> Any:
  """The value stored under (table, key): bytes, or the JSON data put there (tuples come back as lists).

  None when absent, when CACHELEVEL is 0 or the cache is unusable, and when the row fails its checksum (a torn write,
  flipped bits, a value from another format): such a row is deleted so the caller rebuilds it. Nothing is unpickled."""
  if CACHELEVEL == 0:
    return None
  key = _cache_key(key)
  tbl = _cache_table(table)
  where = " AND ".join(f'"{k}"=?' for k in key)
  row = _cache_run(lambda c: c.execute(f'SELECT kind, val, sha FROM "{tbl}" WHERE {where}', tuple(key.values())).fetchone())
  if row is None:
    return None
  kind, val, sha = row
  if isinstance(kind, str) and isinstance(val, bytes) and isinstance(sha, str) and sha == _cache_checksum(tbl, key, kind, val):
    if kind == "bytes":
      return val
    if kind == "json":
      with contextlib.suppress(UnicodeDecodeError, ValueError, RecursionError):
        import json
        return json.loads(val.decode())
  # only the row read here: another process may have just written a good one
  _cache_run(lambda c: c.execute(f'DELETE FROM "{tbl}" WHERE {where} AND sha IS ?', tuple(key.values()) + (sha,)))
  return None


def diskcache_put(table: str, key: Any, val: T) -> T:
  """Store val under (table, key) and return it. val is bytes or plain JSON data (None, bool, int, float, str, and
  lists/dicts of them; anything else raises TypeError). Storage failures (locked or read-only db) are ignored."""
  import json
  if isinstance(val, (bytes, bytearray, memoryview)):
    kind, blob = "bytes", bytes(val)
  else:
    try:
      kind, blob = "json", json.dumps(val, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:
      raise TypeError(f"the disk cache stores bytes or JSON data, not {type(val).__name__}: {e}") from None
  if CACHELEVEL == 0:
    return val
  key = _cache_key(key)
  tbl = _cache_table(table)
  names = ", ".join(f'"{k}"' for k in key)
  cols = ", ".join(f'"{k}" {_KEY_TYPES[type(v)]}' for k, v in key.items())
  row = tuple(key.values()) + (kind, blob, _cache_checksum(tbl, key, kind, blob))

  def store(conn: Any) -> None:
    conn.execute(f'CREATE TABLE IF NOT EXISTS "{tbl}" ({cols}, kind text, val blob, sha text, PRIMARY KEY ({names}))')
    conn.execute(f'REPLACE INTO "{tbl}" ({names}, kind, val, sha) VALUES ({", ".join("?" * len(row))})', row)
  _cache_run(store)
  return val


# the Metadata of the Tensor method being run; LazyBuffers created meanwhile record it (set by the Tensor layer)
import contextvars  # noqa: E402

_METADATA: contextvars.ContextVar[Optional[Metadata]] = contextvars.ContextVar("_METADATA", default=None)
