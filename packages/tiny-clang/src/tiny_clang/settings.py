"""Environment knobs that only the CPU devices read; they belong to this package, not to tiny-core.

THREADS: how many threads a kernel may use. 0 (default) lets the runtime decide (one core first, every core once a
kernel proves long enough), 1 never splits a kernel, N > 1 always splits parallel kernels N ways.
TINY_LLVM_WORKERS: how many helper processes may compile LLVM kernels during precompile. -1 (default) one per core, at
most 4; 0 compiles every kernel in this process.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from tiny.backend import getenv


class Setting:
  """An int read once from the environment variable `key`; `override` changes it for a block (tests, benchmarks)."""

  def __init__(self, key: str, default: int) -> None:
    self.key, self.value = key, int(getenv(key, default))

  @contextlib.contextmanager
  def override(self, value: int) -> Iterator[None]:
    """Use `value` inside the with-block, then restore the previous value (also when the block raises)."""
    old, self.value = self.value, int(value)
    try:
      yield
    finally:
      self.value = old

  def __repr__(self) -> str:
    return f"<{self.key}={self.value}>"


THREADS = Setting("THREADS", 0)
LLVM_WORKERS = Setting("TINY_LLVM_WORKERS", -1)
