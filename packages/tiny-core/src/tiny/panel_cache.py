"""Packed matmul panels of realized weights, kept between calls while the weight's memory is unchanged.

`Tensor.dot` copies the right operand of a large CPU product into contiguous panels (see `Renderer.matmul_panel`). For
a weight that copy is the same on every call (~13% of a GPT-2 prefill), so the panels of a weight that is realized and
does not take gradients are packed once and kept, keyed by:

  - the weight's Buffer (weakly: the panels go when the buffer is freed; they take as much memory as the weight),
  - its view on that buffer (ShapeTracker), its dtype and the panel width,
  - the buffer's write version (`Buffer.write_version`) at packing time: every path that writes device memory (kernel
    runs eager or replayed by a JIT, copies, copyin, assign, loads) changes it, so a stale entry is never returned.

A JIT capture that reads cached panels registers a replay guard (`_ReplayRepack`) that compares the weight's write
version before every replay and repacks into the same panel buffer when it moved, so replays never read stale panels
either. A miss while a JIT captures packs lazily as before: the capture then contains the copy kernel itself.
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Dict, Optional, Tuple, cast

from tiny.device import Buffer
from tiny.dtype import DType
from tiny.lazy import LazyBuffer
from tiny.shape.shapetracker import ShapeTracker

if TYPE_CHECKING:
  from tiny.tensor import Tensor

_Key = Tuple[ShapeTracker, DType, int]


class _Panels:
  """Realized panels and the weight's write version they were packed from."""

  __slots__ = ("tensor", "version")

  def __init__(self, tensor: Tensor, version: int) -> None:
    self.tensor, self.version = tensor, version


# weight buffer -> its packed views; the values must not refer to the key, or the weight would never be freed
_cache: weakref.WeakKeyDictionary[Buffer, Dict[_Key, _Panels]] = weakref.WeakKeyDictionary()


def pack_panels(w: Tensor, width: int) -> Tensor:
  """w (k, n) copied (lazily) into contiguous panels (n // width, k, width)."""
  k, n = w.shape
  return w.reshape(k, n // width, width).permute(1, 0, 2).contiguous()


def _weight_buffer(w: Tensor) -> Optional[Buffer]:
  """The buffer behind w when its panels may be cached: a realized, allocated, concrete view that takes no gradient
  (the cached panels are cut off from w's autograd graph: fine under Tensor.no_grad, or when w requires none)."""
  from tiny.tensor import Tensor
  lb = w.lazydata
  if (w.requires_grad and not Tensor.no_grad) or not isinstance(lb, LazyBuffer) or lb.st.vars():
    return None
  if (buf := lb.base.realized) is None or not buf.is_allocated():
    return None
  return buf


def cached_panels(w: Tensor, width: int) -> Optional[Tensor]:
  """Realized panels of w (see `pack_panels`) packed from w's current contents, or None where the caller packs lazily.

  Eager: a miss packs now and keeps the result. While a JIT captures: a hit registers a replay guard, a miss is None."""
  from tiny.engine.realize import capturing
  if (buf := _weight_buffer(w)) is None:
    return None
  lb = w.lazydata
  assert isinstance(lb, LazyBuffer)
  key: _Key = (lb.st, lb.dtype, width)
  Buffer.track_writes()
  version = buf.write_version()
  entries = _cache.get(buf)
  ent = entries.get(key) if entries is not None else None
  if len(capturing) and not hasattr(capturing[0], "add_replay_guard"):
    return None  # a capture that cannot guard its replays: the copy is captured with the product
  if ent is not None and ent.version == version:
    if len(capturing):
      capturing[0].add_replay_guard(_ReplayRepack(lb, ent, buf))
    return ent.tensor
  if len(capturing):
    return None
  from tiny.tensor import Tensor
  panels = pack_panels(Tensor(lb, device=lb.device, requires_grad=False), width).realize()
  if entries is None:
    entries = _cache[buf] = {}
  entries[key] = _Panels(panels, version)
  return panels


class _ReplayRepack:
  """Before a JIT replay: repack the weight into the captured panel buffer when the weight was written since."""

  def __init__(self, weight: LazyBuffer, ent: _Panels, buf: Buffer) -> None:
    # the capture reads the panel buffer, not the weight: holding the weight keeps it (and its buffer) for the repack
    self.weight, self.buf, self.ent = weight, buf, ent
    self.panels = ent.tensor.lazydata
    self.version = ent.version

  def __call__(self) -> None:
    if (version := self.buf.write_version()) == self.version:
      return
    from tiny.tensor import Tensor
    target = Tensor(self.panels, device=self.panels.device, requires_grad=False)
    width = cast(int, target.shape[-1])
    target.assign(pack_panels(Tensor(self.weight, device=self.weight.device, requires_grad=False), width)).realize()
    # the eager entry (if still cached) holds this same panel buffer, which is current again
    self.version = self.ent.version = version


def cache_size() -> int:
  """How many weight buffers have cached panels (for tests: entries go with their buffers)."""
  return len(_cache)
