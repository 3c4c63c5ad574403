"""TinyJit: capture the kernels a function launches once, then replay them without Python graph work.

The first call runs eagerly (it warms caches and realizes lazily created state such as optimizer
buffers), the second call is captured, and every later call replays the captured `ExecItem`s with
the new input buffers swapped in. Tensors a replay returns live in fresh buffers, so results of two
calls never alias each other; an input the function returns (or a view of one) is that call's input.
Symbolic shapes (bound `Variable`s in shapes or passed as arguments) are passed to the kernels as
arguments, so one capture serves every value of the variable.
"""
from __future__ import annotations

import functools
import itertools
import threading
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Sequence, Set, Tuple, TypeVar, Union, cast

from tiny.device import Buffer, Compiled, JitWriteCounter
from tiny.dtype import DType
from tiny.helpers import DEBUG, JIT, GlobalCounters, colored, merge_dicts
from tiny.engine.realize import CompiledRunner, ExecItem, Runner, capturing, run_schedule
from tiny.engine.schedule import _internal_memory_planner, schedule_to_run
from tiny.lazy import LazyBuffer, create_lazybuffer
from tiny.ops import MetaOps
from tiny.registry import Device
from tiny.shape.shapetracker import ShapeTracker
from tiny.shape.symbolic import Variable, sint

ReturnType = TypeVar("ReturnType")


class JitError(RuntimeError):
  """A jitted function was called in a way its capture cannot serve."""


def get_input_replace(jit_cache: List[ExecItem], input_rawbuffers: Sequence[Buffer]) -> Dict[Tuple[int, int], int]:
  """Positions (item, buffer slot) in jit_cache that hold one of input_rawbuffers, mapped to its index."""
  index = {id(b): i for i, b in enumerate(input_rawbuffers)}
  return {(j, i): index[id(b)] for j, ji in enumerate(jit_cache) for i, b in enumerate(ji.bufs) if b is not None and id(b) in index}


class GraphRunner(Runner):
  """Base of device graph executors: replays a list of ExecItems as one unit.

  Subclasses (a device's `graph`) receive the captured items, the buffers that change per call
  (inputs and fresh outputs, in `input_rawbuffers` order) and the first call's var_vals, and
  override `__call__` to launch everything at once. This base runs the items one by one, which is
  still cheaper than eager execution because nothing is scheduled or looked up."""

  def __init__(self, jit_cache: List[ExecItem], input_rawbuffers: List[Buffer], var_vals: Dict[Variable, int]):
    self.jit_cache = jit_cache
    self.input_replace = get_input_replace(jit_cache, input_rawbuffers)
    self.vars = sorted(var_vals.keys(), key=lambda v: v.expr)
    op_est: sint = 0
    mem_est: sint = 0
    for ji in jit_cache:
      op_est, mem_est = op_est + ji.prg.op_estimate, mem_est + ji.prg.mem_estimate
    super().__init__(colored(f"<batched {len(jit_cache)}>", "cyan"), jit_cache[0].prg.dname.split(":")[0], op_est, mem_est)

  def __call__(self, rawbufs: List[Buffer], var_vals: Dict[Variable, int], wait: bool = False) -> Optional[float]:
    for (j, i), input_idx in self.input_replace.items():
      self.jit_cache[j].bufs[i] = rawbufs[input_idx]
    total = 0.0
    for ji in self.jit_cache:
      et = ji.prg(cast(List[Buffer], ji.bufs), var_vals, wait=wait)
      total += et or 0.0
    return total if wait else None


def apply_graph_to_jit(jit_cache: List[ExecItem], input_rawbuffers: List[Buffer], var_vals: Dict[Variable, int]) -> List[ExecItem]:
  """Group consecutive compiled kernels of one device into that device's graph executor (when it has one)."""
  graphed: List[ExecItem] = []
  batch: List[ExecItem] = []
  batch_dev: Optional[Compiled] = None

  def flush() -> None:
    nonlocal batch, batch_dev
    if len(batch) > 1 and batch_dev is not None and batch_dev.graph is not None:
      try:
        runner = batch_dev.graph(batch, input_rawbuffers, var_vals)
        graphed.append(ExecItem(runner, cast(List[Optional[Buffer]], list(input_rawbuffers))))
        if DEBUG >= 2:
          print(f"JIT GRAPHing batch with {len(batch)} kernels on device {batch_dev}")
      except NotImplementedError as e:
        if DEBUG >= 2:
          print(f"JIT graph not used: {e}")
        graphed.extend(batch)
    else:
      graphed.extend(batch)
    batch, batch_dev = [], None

  for ji in jit_cache:
    dev = Device[ji.prg.dname] if isinstance(ji.prg, CompiledRunner) else None
    if dev is None or dev.graph is None:
      flush()
      graphed.append(ji)
      continue
    if batch_dev is not None and batch_dev is not dev:
      flush()
    batch.append(ji)
    batch_dev = dev
  flush()
  return graphed


def _item_device(ei: ExecItem) -> str:
  return ei.prg.dname


def group_by_device(items: List[ExecItem]) -> List[ExecItem]:
  """items reordered so that each device's kernels come in long runs (which a device graph then launches as one).

  A multi-device step interleaves the devices' kernels with the copies between them. Two items that use a common buffer
  keep their order (this also covers buffers the memory planner made share memory); the rest may move: each next item
  is the first ready one on the device that ran last, else the first ready one. One device: returned unchanged."""
  if len({_item_device(ei) for ei in items}) <= 1:
    return items
  deps: List[List[int]] = [[] for _ in items]
  last_user: Dict[int, int] = {}
  for j, ei in enumerate(items):
    for b in ei.bufs:
      if b is not None:
        if (i := last_user.get(id(b.base))) is not None and i != j:
          deps[j].append(i)
        last_user[id(b.base)] = j
  waiting = [len(set(d)) for d in deps]
  users: List[List[int]] = [[] for _ in items]
  for j, d in enumerate(deps):
    for i in set(d):
      users[i].append(j)
  ready = sorted(j for j, w in enumerate(waiting) if w == 0)
  out: List[ExecItem] = []
  cur: Optional[str] = None
  while ready:
    k = next((j for j in ready if _item_device(items[j]) == cur and isinstance(items[j].prg, CompiledRunner)), ready[0])
    ready.remove(k)
    out.append(items[k])
    cur = _item_device(items[k])
    for u in users[k]:
      waiting[u] -= 1
      if waiting[u] == 0:
        ready.insert(next((p for p, r in enumerate(ready) if r > u), len(ready)), u)
  assert len(out) == len(items), "group_by_device lost items: the dependency graph has a cycle"
  return out


def _tensors_in(x: Any) -> List[Any]:
  """Every Tensor in a nested structure of tuples/lists/dicts (in a stable order)."""
  from tiny.tensor import Tensor
  if isinstance(x, Tensor):
    return [x]
  if isinstance(x, (list, tuple)):
    return [t for v in x for t in _tensors_in(v)]
  if isinstance(x, dict):
    return [t for k in x for t in _tensors_in(x[k])]
  return []


def _lbs(t: Any) -> List[LazyBuffer]:
  """The LazyBuffers behind a Tensor: one, or one per device for a multi-device tensor."""
  return list(t.lazydata.lbs)


def _realize(tensors: Sequence[Any]) -> None:
  lbs = [lb for t in tensors for lb in _lbs(t)]
  if lbs:
    sched, var_vals = schedule_to_run(lbs)
    run_schedule(sched, var_vals)


_Signature = Tuple[ShapeTracker, DType, str]


class _Capture:
  """What a captured call recorded: the items, the changing buffers and how to rebuild the outputs."""

  def __init__(self) -> None:
    self.items: List[ExecItem] = []
    self.preexisting: Set[int] = set()
    self.replay_guards: List[Callable[[], None]] = []

  def add_replay_guard(self, guard: Callable[[], None]) -> None:
    """Run guard() before every replay of this capture: the captured kernels read state (a cache of derived data such as
    packed matmul panels) that the guard brings up to date, running any kernels it needs itself."""
    self.replay_guards.append(guard)

  def add(self, ei: ExecItem) -> None:
    # a buffer already allocated when its item is captured existed before (a weight, an input)
    for b in ei.bufs:
      if b is not None and b.is_allocated():
        self.preexisting.add(id(b.base))
    self.items.append(ExecItem(ei.prg, list(ei.bufs), ei.metadata))


class TinyJit(Generic[ReturnType]):
  """Decorator that captures a function's kernels on its second call and replays them afterwards."""

  def __init__(self, fxn: Callable[..., ReturnType]):
    self.fxn = fxn
    functools.update_wrapper(self, fxn)  # type: ignore[arg-type]
    self._lock = threading.RLock()
    # one count of replays for every buffer the captured kernels write (see _note_capture_writes)
    self._writes = JitWriteCounter()
    self.reset()

  def reset(self) -> None:
    """Forget the capture: the next call runs eagerly and the one after captures again."""
    self.cnt = 0
    self.jit_cache: List[ExecItem] = []
    self.input_replace: Dict[Tuple[int, int], int] = {}
    self.expected_names: List[Union[int, str]] = []
    self.expected_sig: List[_Signature] = []
    self.out_template: Any = None
    self.out_bufs: List[Buffer] = []
    self.out_lbs: List[Any] = []
    self.out_multi: List[Any] = []
    self.out_from_input: Dict[int, int] = {}
    self._var_vals: Dict[Variable, int] = {}
    self.written_inputs: List[int] = []
    # checks run before each replay (see add_replay_guard)
    self.replay_guards: List[Callable[[], None]] = []

  @property
  def jit_kernels(self) -> int:
    """How many runners the replay launches (after graph batching)."""
    return len(self.jit_cache)

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    # so @TinyJit works on methods: bind the instance like a function would
    return self if obj is None else functools.partial(self.__call__, obj)

  # *** inputs ***

  def _inputs(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[List[Union[int, str]], List[Any], Dict[Variable, int]]:
    from tiny.tensor import Tensor
    named = [(i, a) for i, a in enumerate(args)] + sorted(kwargs.items())
    names = [n for n, a in named if isinstance(a, Tensor)]
    tensors = [a for _, a in named if isinstance(a, Tensor)]
    if len(set(id(t) for t in tensors)) != len(tensors):
      raise JitError("the same Tensor was passed to a jitted function twice; pass it once")
    # an input's buffer is what a replay swaps, so every input must be backed by a realized buffer
    _realize([t for t in tensors if any(lb.base.realized is None for lb in _lbs(t))])
    for t in tensors:
      if any(lb.base.realized is None for lb in _lbs(t)):  # e.g. an unrealized constant: materialize it in place
        t.lazydata = t.lazydata.contiguous()
        _realize([t])
    bound = [a for _, a in named if isinstance(a, Variable)]
    var_vals = merge_dicts([lb.st.var_vals for t in tensors for lb in _lbs(t)] + [dict([v.unbind()]) for v in bound])
    return names, tensors, var_vals

  @staticmethod
  def _signature(tensors: List[Any]) -> List[_Signature]:
    return [(t.lazydata.st.unbind()[0], t.dtype, t.device) for t in tensors]

  # *** calls ***

  def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
    if not JIT:
      return self.fxn(*args, **kwargs)
    # the call count, the capture and the replay's buffer slots are this object's state: one call at a time
    with self._lock:
      return self._call(args, kwargs)

  def _call(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> ReturnType:
    names, tensors, var_vals = self._inputs(args, kwargs)
    if self.cnt == 0:
      ret = self.fxn(*args, **kwargs)
      _realize(_tensors_in(ret))
    elif self.cnt == 1:
      ret = self._capture(args, kwargs, names, tensors, var_vals)
    else:
      ret = self._replay(names, tensors, var_vals)
    self.cnt += 1
    return ret

  def _capture(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], names: List[Union[int, str]], tensors: List[Any],
               var_vals: Dict[Variable, int]) -> ReturnType:
    cap = _Capture()
    input_bufs = cast(List[Buffer], [lb.base.realized for t in tensors for lb in _lbs(t)])
    capturing.append(cap)
    try:
      ret = self.fxn(*args, **kwargs)
      outs = _tensors_in(ret)
      _realize(outs)
    finally:
      capturing.clear()
    if not cap.items:
      raise JitError(f"{getattr(self.fxn, '__name__', 'function')} launched no kernels to capture; does it return realized Tensors?")
    # outputs computed inside the capture get fresh buffers at every replay
    self.out_lbs = [lb for t in outs for lb in _lbs(t)]
    # a multi-device output is rebuilt from its shards: (number of shards, axis, real shards), None for a plain tensor
    self.out_multi = [(len(t.lazydata.lbs), t.lazydata.axis, list(t.lazydata.real)) if hasattr(t.lazydata, "axis") else None for t in outs]
    self.out_bufs = []
    for lb in self.out_lbs:
      b = lb.base.realized
      if b is not None and id(b.base) not in cap.preexisting and not any(b is x for x in input_bufs) and not any(b is x for x in self.out_bufs):
        self.out_bufs.append(b)
    self.out_template = ret
    # outputs that are inputs (or views of one): a replay returns that call's input there, not the captured one
    in_index = {id(b): i for i, b in enumerate(input_bufs)}
    self.out_from_input = {k: in_index[id(lb.base.realized)] for k, lb in enumerate(self.out_lbs)
                           if lb.base.realized is not None and id(lb.base.realized) in in_index}
    # let intermediates of the step share memory; inputs, outputs and preexisting buffers keep theirs
    keep = set(b.base for b in input_bufs + self.out_bufs)
    keep |= {b.base for ei in cap.items for b in ei.bufs if b is not None and id(b.base) in cap.preexisting}
    assigned = _internal_memory_planner([cast(List[Buffer], ei.bufs) for ei in cap.items], noopt_buffers=keep, debug_prefix="JIT ")
    items = [ExecItem(ei.prg, [assigned.get(b, b) if b is not None else None for b in ei.bufs], ei.metadata) for ei in cap.items]
    for ei in items:
      for b in ei.bufs:
        if b is not None:
          b.ensure_allocated()
    changing = input_bufs + self.out_bufs
    self._note_capture_writes(items, changing)
    self.replay_guards = list(cap.replay_guards)
    self.jit_cache = apply_graph_to_jit(group_by_device(items), changing, var_vals)
    self.input_replace = get_input_replace(self.jit_cache, changing)
    self.expected_names, self.expected_sig = names, self._signature(tensors)
    if DEBUG >= 1:
      print(f"JIT captured {len(cap.items)} kernels with {len(input_bufs)} inputs, {len(self.out_bufs)} outputs")
    # the input buffers of the next call take these slots
    for (j, i) in self.input_replace:
      self.jit_cache[j].bufs[i] = None
    return ret

  def _note_capture_writes(self, items: List[ExecItem], changing: List[Buffer]) -> None:
    """Give every buffer the captured kernels write this JIT's replay counter, so that a replay changes their
    write_version with one increment. The per-call buffers instead: an input a kernel writes is noted at each replay
    (the fresh outputs are new buffers every call)."""
    index = {id(b): i for i, b in enumerate(changing)}
    written: Set[int] = set()
    for ei in items:
      bufs = cast(List[Buffer], ei.bufs)
      for pos in (range(len(bufs)) if ei.prg.writes is None else ei.prg.writes):
        if (i := index.get(id(bufs[pos]))) is not None:
          written.add(i)
        else:
          bufs[pos].add_jit_writer(self._writes)
    n_inputs = len(changing) - len(self.out_bufs)
    self.written_inputs = sorted(i for i in written if i < n_inputs)

  def _check(self, names: List[Union[int, str]], tensors: List[Any]) -> None:
    if names != self.expected_names:
      raise JitError(f"jitted function called with Tensor arguments {names}, but it was captured with {self.expected_names}")
    sig = self._signature(tensors)
    for n, got, want in zip(names, sig, self.expected_sig):
      if got[0].views != want[0].views:
        raise JitError(f"argument {n!r}: shape {got[0].shape} does not match the captured shape {want[0].shape} "
                       "(use a bound Variable for sizes that change between calls)")
      if got[1] != want[1]:
        raise JitError(f"argument {n!r}: dtype {got[1]} does not match the captured dtype {want[1]}")
      if got[2] != want[2]:
        raise JitError(f"argument {n!r}: device {got[2]} does not match the captured device {want[2]}")

  def _replay(self, names: List[Union[int, str]], tensors: List[Any], var_vals: Dict[Variable, int]) -> ReturnType:
    self._check(names, tensors)
    fresh = [Buffer(b.device, b.size, b.dtype, options=b.options).allocate() for b in self.out_bufs]
    changing = [lb.base.realized for t in tensors for lb in _lbs(t)] + fresh
    for (j, i), idx in self.input_replace.items():
      self.jit_cache[j].bufs[i] = changing[idx]
    for guard in self.replay_guards:
      guard()
    self._writes.count += 1
    for idx in self.written_inputs:
      cast(Buffer, changing[idx]).note_write()
    for ei in self.jit_cache:
      ei.run(var_vals, jit=True)
    for (j, i) in self.input_replace:
      self.jit_cache[j].bufs[i] = None
    if DEBUG >= 2:
      print(f"JIT replayed {len(self.jit_cache)} items, {GlobalCounters.kernel_count} kernels so far")
    return self._rebuild(fresh, tensors, var_vals)

  def _rebuild(self, fresh: List[Buffer], inputs: List[Any], var_vals: Dict[Variable, int]) -> Any:
    """The captured return structure, with each output Tensor now backed by this call's buffers (and inputs)."""
    swap = {id(old): new for old, new in zip(self.out_bufs, fresh)}
    self._var_vals = var_vals
    try:
      return self._rebuild_value(self.out_template, swap, [lb for t in inputs for lb in _lbs(t)], itertools.count(), itertools.count())
    finally:
      self._var_vals = {}

  def _rebuild_lb(self, k: int, swap: Dict[int, Buffer], inputs: List[LazyBuffer]) -> Optional[LazyBuffer]:
    """Output LazyBuffer k of this replay (None: a preexisting buffer, which stays what it was)."""
    lb = self.out_lbs[k]
    # a symbolic output shape takes this call's values of its Variables, not the captured call's
    st, base_st = lb.st.bind(self._var_vals), lb.base.st.bind(self._var_vals)
    if (i := self.out_from_input.get(k)) is not None:
      src = inputs[i].base
      return src if lb.base is lb else create_lazybuffer(lb.device, st, lb.dtype, base=src, enable_cache=False)
    buf = lb.base.realized
    if buf is None or id(buf) not in swap:
      return None
    base = LazyBuffer(lb.device, base_st, lb.base.dtype, MetaOps.EMPTY)
    base.buffer = swap[id(buf)]
    del base.srcs
    return base if lb.base is lb else create_lazybuffer(lb.device, st, lb.dtype, base=base, enable_cache=False)

  def _rebuild_value(self, x: Any, swap: Dict[int, Buffer], inputs: List[LazyBuffer], counter: Iterator[int], lb_counter: Iterator[int]) -> Any:
    # a method, not a recursive closure: a closure that refers to itself is a reference cycle, which would keep every
    # call's output buffers alive until the garbage collector runs (and the next call could not reuse them)
    from tiny.tensor import Tensor
    if isinstance(x, Tensor):
      multi = self.out_multi[next(counter)]
      ks = [next(lb_counter) for _ in range(1 if multi is None else multi[0])]
      new = [self._rebuild_lb(k, swap, inputs) for k in ks]
      if all(n is None for n in new):
        return x  # a preexisting buffer (a weight, state): it is what it was
      lbs = [n if n is not None else self.out_lbs[k] for n, k in zip(new, ks)]
      if multi is None:
        return Tensor(lbs[0], device=lbs[0].device, requires_grad=False)
      from tiny.multi import MultiLazyBuffer
      return Tensor(cast(LazyBuffer, MultiLazyBuffer(lbs, multi[1], multi[2])), device=tuple(lb.device for lb in lbs), requires_grad=False)
    if isinstance(x, tuple):
      return tuple(self._rebuild_value(v, swap, inputs, counter, lb_counter) for v in x)
    if isinstance(x, list):
      return [self._rebuild_value(v, swap, inputs, counter, lb_counter) for v in x]
    if isinstance(x, dict):
      return {key: self._rebuild_value(x[key], swap, inputs, counter, lb_counter) for key in x}
    return x
