"""Differential fuzzing of whole Tensor programs: the same small program run on a device under several kernel
optimizations (NOOPT, the default heuristic, random valid opt sequences) and compared with numpy or torch.

A program is plain data (`Program`: input tensors with literal values, a list of `Op` records, the outputs, and
optionally a scalar loss whose gradients are compared too), so it can be

* run on tiny: `Program.source()` is the Tensor code, executed as is (`run_program`),
* run on a reference: `reference_results` (torch when installed, forward and gradients; numpy otherwise, forward only),
* printed as a runnable reproducer (`reproducer`): the tiny code with literal inputs, the opts applied to each kernel,
  the reference values and the difference that was seen.

`programs()` is a hypothesis strategy drawing such programs; `check_program` runs one under a list of `OptSetting`s and
raises an AssertionError whose message is the reproducer. Typical use::

    from hypothesis import given, settings, strategies as st
    from tiny.testing.program_fuzz import check_program, default_settings, programs

    @settings(max_examples=50, deadline=None)
    @given(prog=programs(), seed=st.integers(0, 2**31 - 1))
    def test_programs(prog, seed):
      check_program(prog, "CLANG", default_settings(seed))

Values are kept exactly representable where that is cheap: float inputs are multiples of 1/4, and every op tracks an
interval and a granularity, so most results (sums, products, pads, matmuls of such values) are exact in float32 in any
summation order. Those are compared bit for bit; a value that went through exp/log/sqrt or a division is compared with a
tolerance. Ops whose result jumps (comparisons, casts to ints) only take exact operands, so rounding can never flip them.
The generator avoids what other tests own: no division by (near) zero, no NaN or inf, indices always in range.

The opts are injected by lowering the schedule here (`realize_with_opts`): each kernel ScheduleItem becomes a Kernel
optimized as the `OptSetting` says (NOOPT and the heuristic through `engine.realize.get_kernel`, random settings by
drawing opts that `Kernel.apply_opt` accepts from BEAM's action list), then a CompiledRunner; the method cache is not
used, so every setting really compiles its own kernels, and the opts each kernel got are recorded for the reproducer.

Torch is imported lazily; without it only forward results are checked (against numpy).
"""
from __future__ import annotations

import itertools
import math
import random
import time
import traceback
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tiny.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tiny.dtype import dtypes
from tiny.engine import pending
from tiny.engine.realize import CompiledRunner, ExecItem, get_kernel, lower_schedule_item, realize_lock
from tiny.engine.search import actions
from tiny.helpers import Context, ansistrip, prod
from tiny.ops import LazyOp, MetaOps
from tiny.registry import Device
from tiny.tensor import Tensor

if TYPE_CHECKING:
  # hypothesis is only needed to draw programs (tiny.testing.strategies, imported where it is used)
  from hypothesis import strategies as st

  from tiny.renderer import Renderer

# *** program data ***

FLOAT_DTYPES = ("float32", "float16", "float64")
INT_DTYPES = ("int32", "int8", "uint8", "int64")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
# the dtypes inputs and most ops use; the others only appear through casts
MAIN_DTYPES = ("float32", "int32", "bool")

# value ranges kept so that nothing overflows (ints) or loses its exactness too fast (floats); an op whose result could
# leave its range is not generated
_LIMIT = {"float32": 2.0 ** 20, "float16": 1000.0, "float64": 2.0 ** 30, "int32": 2.0 ** 24, "int8": 127.0, "uint8": 255.0,
          "int64": 2.0 ** 40, "bool": 1.0}
_INT_MIN = {"int8": -128.0, "uint8": 0.0, "bool": 0.0}
# unsigned dtypes whose add/sub/mul may wrap around (numpy, torch and C all take them modulo 2**bits); signed ints may not
# (C leaves their overflow undefined, and frameworks differ)
_WRAPS = {"uint8": 256}
# mantissa bits: a float value with granularity 2**lsb is exact while |v| < 2**(bits + lsb)
_MANTISSA = {"float32": 23, "float16": 10, "float64": 52}
# comparison tolerance (rtol and atol relative to the largest expected magnitude) for values that are not exact
_TOL = {"float32": 1e-4, "float16": 2e-2, "float64": 1e-7}

# floordiv and mod are integer only (Python's // and %, which tiny documents for ints of either sign)
BINARY_OPS = ("add", "sub", "mul", "div", "maximum", "floordiv", "mod")
INT_BINARY_OPS = ("floordiv", "mod")
COMPARE_OPS = ("lt", "gt", "eq", "ne")
UNARY_OPS = ("neg", "relu", "exp", "log", "sqrt")
MOVEMENT_OPS = ("reshape", "permute", "expand", "pad", "shrink", "flip", "stride")
REDUCE_OPS = ("sum", "max", "min", "mean")
OTHER_OPS = ("where", "cast", "contiguous", "index", "cumsum", "gather", "matmul", "conv2d", "softmax", "log_softmax")
ALL_OPS = BINARY_OPS + COMPARE_OPS + UNARY_OPS + MOVEMENT_OPS + REDUCE_OPS + OTHER_OPS


@dataclass(frozen=True)
class Input:
  """An input tensor: name, shape, dtype name, values (flattened, row-major) and whether its gradient is compared."""

  name: str
  shape: Tuple[int, ...]
  dtype: str
  data: Tuple[Any, ...]
  requires_grad: bool = False

  def array(self) -> np.ndarray:
    """The values as a numpy array of the input's shape and dtype."""
    return np.array(self.data, dtype=_np_dtype(self.dtype)).reshape(self.shape)


@dataclass(frozen=True)
class Value:
  """What the generator knows about a value: shape, dtype, an interval holding every element, the granularity 2**lsb
  of a float that is still exact (None: rounded somewhere), whether it depends differentiably on a float input, and
  whether its gradient is safe to compare (no tie of max/relu on rounded values)."""

  shape: Tuple[int, ...]
  dtype: str
  lo: float
  hi: float
  lsb: Optional[int] = 0
  grad: bool = False
  grad_safe: bool = True

  @property
  def exact(self) -> bool:
    """Every element is computed without rounding (ints and bools always are)."""
    return self.dtype not in FLOAT_DTYPES or self.lsb is not None


@dataclass(frozen=True)
class Op:
  """One step of a program: `name = op(*srcs, arg)`; srcs name inputs or earlier ops, arg is op specific plain data
  (see `ALL_OPS` and `Program.source`); value is the result's shape, dtype and range."""

  name: str
  op: str
  srcs: Tuple[str, ...]
  arg: Any
  value: Value


@dataclass(frozen=True)
class Program:
  """A Tensor program: inputs, ops in order, the outputs, and the (output, weight input) pairs of the scalar loss
  `sum((output * weight).sum())` whose gradients are compared for every input with requires_grad (empty: no backward)."""

  inputs: Tuple[Input, ...]
  ops: Tuple[Op, ...]
  outputs: Tuple[str, ...]
  loss: Tuple[Tuple[str, str], ...] = ()

  @property
  def backward(self) -> bool:
    """The program computes gradients."""
    return bool(self.loss)

  def values(self) -> Dict[str, Value]:
    """Value of every input and op by name."""
    ret = {i.name: _input_value(i) for i in self.inputs}
    ret.update({o.name: o.value for o in self.ops})
    return ret

  @property
  def grad_inputs(self) -> Tuple[str, ...]:
    """Inputs whose gradient is compared: the ones the loss reaches along differentiable edges."""
    if not self.loss:
      return ()
    ops = {o.name: o for o in self.ops}
    seen: set = set()
    todo = [o for o, _ in self.loss]
    while todo:
      n = todo.pop()
      if n in seen:
        continue
      seen.add(n)
      if n in ops:
        todo.extend(s for i, s in enumerate(ops[n].srcs) if _differentiable(ops[n], i))
    return tuple(i.name for i in self.inputs if i.requires_grad and i.name in seen)

  def result_names(self) -> List[str]:
    """Names of what is compared: the outputs, then `grad(x)` for each of grad_inputs."""
    return list(self.outputs) + [f"grad({x})" for x in self.grad_inputs]

  def source(self, device: str = "DEVICE") -> List[str]:
    """The program as tiny code, one statement per line (device is a Python expression). After it runs, the names
    of the inputs and ops are bound, and `loss` when the program has a backward pass."""
    vals = self.values()
    lines = [_input_source(i, device, self.backward) for i in self.inputs]
    lines += [f"{o.name} = {_op_source(o, vals, self.backward)}" for o in self.ops]
    if self.loss:
      lines.append("loss = " + " + ".join(f"({o} * {w}).sum()" for o, w in self.loss))
      lines.append("loss.backward()")
    return lines

  def result_source(self) -> str:
    """A Python list expression of the results (after `source` ran), in result_names order."""
    return "[" + ", ".join(list(self.outputs) + [f"{x}.grad" for x in self.grad_inputs]) + "]"


def _np_dtype(dt: str) -> Any:
  return np.dtype(np.bool_) if dt == "bool" else np.dtype(dt)


def _lsb_of_array(a: np.ndarray) -> Optional[int]:
  """The largest k (at most 0) with every element a multiple of 2**k; None when there is none down to 2**-24."""
  if a.dtype.kind != "f":
    return 0
  x = a.astype(np.float64)
  for k in range(0, -25, -1):
    if np.all(np.mod(x * 2.0 ** -k, 1.0) == 0):
      return k
  return None


def _lsb_of(c: float) -> Optional[int]:
  f = Fraction(c)
  if f.denominator & (f.denominator - 1):
    return None
  return -(f.denominator.bit_length() - 1)


def _input_value(i: Input) -> Value:
  a = i.array()
  lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
  return Value(i.shape, i.dtype, lo, hi, _lsb_of_array(a), grad=i.requires_grad)


def _differentiable(op: Op, i: int) -> bool:
  """Whether the gradient flows from op into its i-th source."""
  if op.op in COMPARE_OPS:
    return False
  if op.op == "cast":
    return op.arg in FLOAT_DTYPES
  if op.op == "where":
    return i > 0
  if op.op in ("index", "gather"):
    return i == 0
  return True


# *** tiny source ***

def _literal(c: Any) -> str:
  return repr(bool(c)) if isinstance(c, (bool, np.bool_)) else repr(c)


def _input_source(i: Input, device: str, backward: bool) -> str:
  data = "[" + ", ".join(_literal(x) for x in i.data) + "]"
  npdt = "np.bool_" if i.dtype == "bool" else f"np.{i.dtype}"
  rg = ", requires_grad=True" if i.requires_grad and backward else ""
  return f"{i.name} = Tensor(np.array({data}, dtype={npdt}).reshape({i.shape}), device={device}{rg})"


def _slice_source(s: Tuple[Optional[int], Optional[int], Optional[int]]) -> str:
  start, stop, step = s
  txt = f"{'' if start is None else start}:{'' if stop is None else stop}"
  return txt + (f":{step}" if step is not None else "")


def _op_source(o: Op, vals: Dict[str, Value], backward: bool) -> str:
  """The tiny expression computing op o."""
  s, arg, k = o.srcs, o.arg, o.op
  if k in BINARY_OPS or k in COMPARE_OPS:
    rhs = s[1] if len(s) > 1 else _literal(arg)
    if k == "maximum":
      return f"{s[0]}.maximum({rhs})"
    sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "lt": "<", "gt": ">", "eq": "==", "ne": "!="}[k]
    return f"{s[0]} {sym} {rhs}" if k in BINARY_OPS else f"({s[0]} {sym} {rhs})"
  if k == "neg":
    return f"-{s[0]}"
  if k in UNARY_OPS:
    return f"{s[0]}.{k}()"
  if k == "where":
    return f"{s[0]}.where({s[1]}, {s[2] if len(s) > 2 else _literal(arg)})"
  if k == "cast":
    # tiny lets a gradient flow back through a cast to an int; torch (the reference) does not, so cut it explicitly
    det = ".detach()" if backward and vals[s[0]].grad and arg not in FLOAT_DTYPES else ""
    return f"{s[0]}{det}.cast(dtypes.{arg})"
  if k == "contiguous":
    return f"{s[0]}.contiguous()"
  if k in ("reshape", "permute", "expand", "pad", "shrink", "flip"):
    return f"{s[0]}.{k}({tuple(arg)!r})"
  if k == "stride":
    return f"{s[0]}[{', '.join(_slice_source((None, None, m)) for m in arg)}]"
  if k == "index":
    items = []
    for it in arg:
      items.append(str(it[1]) if it[0] == "int" else s[1 + it[1]] if it[0] == "tensor" else _slice_source(it[1:]))
    return f"{s[0]}[{', '.join(items)}{',' if len(items) == 1 else ''}]"
  if k in REDUCE_OPS:
    axes, keepdim = arg
    return f"{s[0]}.{k}({'axis=' + repr(axes) + ', ' if axes is not None else ''}keepdim={keepdim})"
  if k in ("cumsum", "softmax", "log_softmax"):
    return f"{s[0]}.{k}({arg})"
  if k == "gather":
    return f"{s[0]}.gather({arg}, {s[1]})"
  if k == "matmul":
    return f"{s[0]} @ {s[1]}"
  if k == "conv2d":
    stride, padding, dilation, groups = arg
    return f"{s[0]}.conv2d({s[1]}, {s[2] if len(s) > 2 else None}, groups={groups}, stride={stride}, dilation={dilation}, padding={padding})"
  raise ValueError(f"unknown op {k!r}")


# *** value inference: the shape, dtype and range of each op's result (None: the op is not valid or not safe here) ***

def _broadcast(*shapes: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
  nd = max(len(s) for s in shapes)
  out = []
  for dims in zip(*[(1,) * (nd - len(s)) + s for s in shapes]):
    big = {d for d in dims if d != 1}
    if len(big) > 1:
      return None
    out.append(big.pop() if big else 1)
  return tuple(out)


def _finish(shape: Tuple[int, ...], dtype: str, lo: float, hi: float, lsb: Optional[int], grad: bool, grad_safe: bool) -> Optional[Value]:
  """The Value, or None when its range leaves the dtype's safe range. Floats lose exactness past the mantissa."""
  if not (math.isfinite(lo) and math.isfinite(hi)) or hi > _LIMIT[dtype] or lo < _INT_MIN.get(dtype, -_LIMIT[dtype]):
    return None
  if dtype in FLOAT_DTYPES:
    if lsb is not None and (max(abs(lo), abs(hi)) >= 2.0 ** (_MANTISSA[dtype] + lsb) or lsb < -_MANTISSA[dtype]):
      lsb = None
  else:
    lsb, grad = 0, False
  return Value(shape, dtype, lo, hi, lsb, grad, grad_safe)


def _wrapped(dtype: str, lo: float, hi: float) -> Tuple[float, float]:
  """The range of an add/sub/mul result whose exact range is [lo, hi]: an unsigned dtype wraps, so a range leaving
  it becomes the whole dtype (a hull of the pieces would be tighter, but every value is reachable often enough)."""
  if dtype in _WRAPS and (lo < 0 or hi >= _WRAPS[dtype]):
    return 0.0, float(_WRAPS[dtype] - 1)
  return lo, hi


def _int_division(op: str, shape: Tuple[int, ...], x: Value, y: Value) -> Optional[Value]:
  """x // y or x % y (floor semantics) for ints, by a divisor whose range excludes zero; None otherwise."""
  if x.dtype not in INT_DTYPES or y.lo <= 0 <= y.hi:
    return None
  if op == "floordiv":
    # x / y is monotonic in each operand while y keeps its sign, so the corners bound it, and floor keeps the order;
    # a quotient the dtype cannot hold (int8 -128 // -1) is refused by _finish
    qs = [math.floor(Fraction(int(a)) / int(b)) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
    return _finish(shape, x.dtype, float(min(qs)), float(max(qs)), 0, False, True)
  # the remainder takes the divisor's sign and is smaller than it; a dividend already inside that range is unchanged
  if y.lo > 0:
    lo, hi = 0.0, y.hi - 1
    if x.lo >= 0:
      hi = min(hi, x.hi)
  else:
    lo, hi = y.lo + 1, 0.0
    if x.hi <= 0:
      lo = max(lo, x.lo)
  return _finish(shape, x.dtype, lo, hi, 0, False, True)


def _const_value(c: Any, dtype: str) -> Value:
  return Value((), dtype, float(c), float(c), _lsb_of(float(c)) if dtype in FLOAT_DTYPES else 0)


def _min_lsb(*vs: Value) -> Optional[int]:
  return None if any(v.lsb is None for v in vs) else min(int(v.lsb) for v in vs)  # type: ignore[arg-type]


def _products(a: Value, b: Value) -> Tuple[float, float]:
  p = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
  return min(p), max(p)


def _numpy_index_shape(shape: Tuple[int, ...], items: Sequence[Any], index_shapes: Sequence[Tuple[int, ...]]) -> Tuple[int, ...]:
  dummy = np.zeros(shape, dtype=np.int8)
  return tuple(dummy[_numpy_index(items, [np.zeros(s, dtype=np.int64) for s in index_shapes])].shape)


def _numpy_index(items: Sequence[Any], tensors: Sequence[Any]) -> Tuple[Any, ...]:
  out: List[Any] = []
  for it in items:
    out.append(it[1] if it[0] == "int" else tensors[it[1]] if it[0] == "tensor" else slice(*it[1:]))
  return tuple(out)


def infer(op: str, srcs: Sequence[Value], arg: Any) -> Optional[Value]:
  """The Value of op applied to srcs with arg, or None when that op is invalid or unsafe (could overflow, divide by
  about zero, take the log of a non-positive number, compare or truncate values that were rounded)."""
  try:
    return _infer(op, srcs, arg)
  except (ValueError, IndexError, TypeError):
    return None


def _infer(op: str, srcs: Sequence[Value], arg: Any) -> Optional[Value]:
  a = srcs[0]
  grad_safe = all(s.grad_safe for s in srcs)
  if op in BINARY_OPS or op in COMPARE_OPS or op == "where":
    ops = list(srcs) if op != "where" else list(srcs[1:])
    if len(ops) == 1:
      ops.append(_const_value(arg, ops[0].dtype))
      # a constant the dtype cannot hold (-3 next to a uint8) is wrapped by some frameworks and compared exactly by others
      if not _INT_MIN.get(ops[0].dtype, -_LIMIT[ops[0].dtype]) <= ops[1].lo <= _LIMIT[ops[0].dtype]:
        return None
    x, y = ops
    if x.dtype != y.dtype or (op != "where" and x.dtype == "bool" and op not in ("eq", "ne")):
      return None
    shape = _broadcast(*[s.shape for s in srcs])
    if shape is None:
      return None
    if op in COMPARE_OPS:
      return Value(shape, "bool", 0, 1) if x.exact and y.exact else None
    if op == "where":
      if a.dtype != "bool":
        return None
      return _finish(shape, x.dtype, min(x.lo, y.lo), max(x.hi, y.hi), _min_lsb(x, y), x.grad or y.grad, grad_safe)
    grad = x.grad or y.grad
    if op == "add":
      return _finish(shape, x.dtype, *_wrapped(x.dtype, x.lo + y.lo, x.hi + y.hi), _min_lsb(x, y), grad, grad_safe)
    if op == "sub":
      return _finish(shape, x.dtype, *_wrapped(x.dtype, x.lo - y.hi, x.hi - y.lo), _min_lsb(x, y), grad, grad_safe)
    if op == "mul":
      # the same Value object on both sides is one tensor times itself: a square, never negative
      lo, hi = _products(x, y) if x is not y else (0.0 if x.lo <= 0 <= x.hi else min(x.lo ** 2, x.hi ** 2), max(x.lo ** 2, x.hi ** 2))
      lsb = None if x.lsb is None or y.lsb is None else x.lsb + y.lsb
      return _finish(shape, x.dtype, *_wrapped(x.dtype, lo, hi), lsb, grad, grad_safe)
    if op in INT_BINARY_OPS:
      return _int_division(op, shape, x, y)
    if op == "maximum":
      # a tie between rounded values could go either way, and with it the gradient
      return _finish(shape, x.dtype, max(x.lo, y.lo), max(x.hi, y.hi), _min_lsb(x, y), grad, grad_safe and (x.exact and y.exact or not grad))
    # div: floats only, by a value bounded away from zero
    if x.dtype not in FLOAT_DTYPES or (y.lo < 0.25 and y.hi > -0.25):
      return None
    const_pow2 = y.lo == y.hi and y.lsb is not None and _lsb_of(1.0 / y.lo) is not None and abs(y.lo) in [2.0 ** k for k in range(-4, 5)]
    if x.dtype != "float32" and not const_pow2:
      return None
    lo, hi = _products(x, Value((), y.dtype, 1.0 / y.hi, 1.0 / y.lo))
    lsb = None if not const_pow2 or x.lsb is None else x.lsb - int(round(math.log2(abs(y.lo))))
    return _finish(shape, x.dtype, lo, hi, lsb, grad, grad_safe)
  if op in UNARY_OPS:
    if op == "neg":
      if a.dtype == "bool" or a.dtype == "uint8":
        return None
      return _finish(a.shape, a.dtype, -a.hi, -a.lo, a.lsb, a.grad, grad_safe)
    if a.dtype not in FLOAT_DTYPES:
      return None
    if op == "relu":
      return _finish(a.shape, a.dtype, max(a.lo, 0.0), max(a.hi, 0.0), a.lsb, a.grad, grad_safe and (a.exact or not a.grad))
    if a.dtype != "float32":
      return None
    if op == "exp":
      return _finish(a.shape, a.dtype, math.exp(a.lo), math.exp(a.hi), None, a.grad, grad_safe) if a.hi <= 8 else None
    if a.lo < 0.25:   # log and sqrt (and their gradients) well inside their domain
      return None
    fn = math.log if op == "log" else math.sqrt
    return _finish(a.shape, a.dtype, fn(a.lo), fn(a.hi), None, a.grad, grad_safe)
  if op == "cast":
    dt = arg
    if dt not in DTYPES or dt == a.dtype:
      return None
    if dt == "bool":
      return Value(a.shape, "bool", 0, 1) if a.exact else None
    if dt in INT_DTYPES:
      if not a.exact:
        return None
      lo, hi = float(math.trunc(a.lo)), float(math.trunc(a.hi))
      if a.dtype in INT_DTYPES:
        # an int converted to an unsigned int is taken modulo 2**bits (C defines it; numpy and torch agree); a float
        # out of range is undefined in C, so that still is not generated
        lo, hi = _wrapped(dt, lo, hi)
      return _finish(a.shape, dt, lo, hi, 0, False, True)
    v = _finish(a.shape, dt, a.lo, a.hi, a.lsb if a.dtype != "bool" else 0, a.grad, grad_safe)
    # a cast to a narrower float is only generated where it does not round
    return v if v is not None and (v.exact or not a.exact) and (dt != "float16" or v.exact) else None
  if op == "contiguous":
    return a
  if op in MOVEMENT_OPS:
    from tiny.testing.strategies import op_output_shape
    if op == "flip" and not arg:
      return None
    shape = op_output_shape(a.shape, (op, tuple(arg)))
    if op == "reshape" and prod(shape) != prod(a.shape):
      return None
    if op == "permute" and sorted(arg) != list(range(len(a.shape))):
      return None
    if op == "expand" and (len(shape) != len(a.shape) or any(s != n and s != 1 for s, n in zip(a.shape, shape))):
      return None
    if op in ("pad", "shrink", "flip", "stride") and len(arg) != len(a.shape) and op != "flip":
      return None
    if 0 in shape:
      return None
    padded = op == "pad" and any(b or e for b, e in arg)
    return replace(a, shape=tuple(shape), lo=min(a.lo, 0.0) if padded else a.lo, hi=max(a.hi, 0.0) if padded else a.hi)
  if op == "index":
    if any(s.dtype != "int32" for s in srcs[1:]):
      return None
    shape = _numpy_index_shape(a.shape, arg, [s.shape for s in srcs[1:]])
    return replace(a, shape=shape) if 0 not in shape else None
  if op in REDUCE_OPS:
    axes, keepdim = arg
    if a.dtype not in ("float32", "int32") or (op == "mean" and a.dtype != "float32") or not a.shape:
      return None
    red = tuple(range(len(a.shape))) if axes is None else tuple(axes)
    if not red or len(set(red)) != len(red) or any(not 0 <= x < len(a.shape) for x in red):
      return None
    shape = tuple(1 if i in red else s for i, s in enumerate(a.shape) if keepdim or i not in red)
    n = prod(a.shape[i] for i in red)
    if op in ("max", "min"):
      return _finish(shape, a.dtype, a.lo, a.hi, a.lsb, a.grad, grad_safe and (a.exact or not a.grad))
    if op == "sum":
      return _finish(shape, a.dtype, n * a.lo, n * a.hi, a.lsb, a.grad, grad_safe)
    lsb = a.lsb - (n.bit_length() - 1) if a.lsb is not None and n & (n - 1) == 0 else None
    return _finish(shape, a.dtype, a.lo, a.hi, lsb, a.grad, grad_safe)
  if op in ("softmax", "log_softmax"):
    # two reduces over one axis in one kernel (max, then a sum of exps): the pattern of attention and of every loss
    if a.dtype != "float32" or not 0 <= arg < len(a.shape) or a.hi - a.lo > 30:
      return None
    lo = 0.0 if op == "softmax" else a.lo - a.hi - math.log(a.shape[arg])
    return _finish(a.shape, a.dtype, lo, 1.0 if op == "softmax" else 0.0, None, a.grad, grad_safe)
  if op == "cumsum":
    if a.dtype not in ("float32", "int32") or not 0 <= arg < len(a.shape):
      return None
    n = a.shape[arg]
    return _finish(a.shape, a.dtype, min(a.lo, n * a.lo), max(a.hi, n * a.hi), a.lsb, a.grad, grad_safe)
  if op == "gather":
    idx = srcs[1]
    if a.dtype not in ("float32", "int32") or idx.dtype != "int32" or len(idx.shape) != len(a.shape) or not 0 <= arg < len(a.shape):
      return None
    if any(i > s for d, (s, i) in enumerate(zip(a.shape, idx.shape)) if d != arg) or idx.lo < 0 or idx.hi >= a.shape[arg]:
      return None
    return replace(a, shape=idx.shape)
  if op == "matmul":
    x, w = srcs
    if x.dtype != "float32" or w.dtype != "float32" or not x.shape or not w.shape:
      return None
    shape = tuple(np.matmul(np.zeros(x.shape, np.int8), np.zeros(w.shape, np.int8)).shape)
    k = x.shape[-1]
    lo, hi = _products(x, w)
    lsb = None if x.lsb is None or w.lsb is None else x.lsb + w.lsb
    return _finish(shape, "float32", k * min(lo, 0.0), k * max(hi, 0.0), lsb, x.grad or w.grad, grad_safe)
  if op == "conv2d":
    (stride, padding, dilation, groups), x, w = arg, srcs[0], srcs[1]
    if any(s.dtype != "float32" for s in srcs) or len(x.shape) != 4 or len(w.shape) != 4:
      return None
    n, cin, h, wd = x.shape
    cout, cing, kh, kw = w.shape
    if cing * groups != cin or cout % groups or (len(srcs) > 2 and srcs[2].shape != (cout,)):
      return None
    oh, ow = [(d + 2 * padding - dilation * (k - 1) - 1) // stride + 1 for d, k in ((h, kh), (wd, kw))]
    if oh < 1 or ow < 1:
      return None
    lo, hi = _products(x, w)
    terms = cing * kh * kw
    lo, hi = terms * min(lo, 0.0), terms * max(hi, 0.0)
    lsb = None if x.lsb is None or w.lsb is None else x.lsb + w.lsb
    if len(srcs) > 2:
      lo, hi, lsb = lo + srcs[2].lo, hi + srcs[2].hi, None if lsb is None or srcs[2].lsb is None else min(lsb, srcs[2].lsb)
    return _finish((n, cout, oh, ow), "float32", lo, hi, lsb, any(s.grad for s in srcs), grad_safe)
  raise ValueError(f"unknown op {op!r}")


def make_program(inputs: Sequence[Input], ops: Sequence[Tuple[str, str, Sequence[str], Any]], outputs: Sequence[str],
                 loss: Sequence[Tuple[str, str]] = ()) -> Program:
  """A Program from (name, op, srcs, arg) tuples; raises ValueError naming the first op that is invalid or unsafe."""
  vals: Dict[str, Value] = {i.name: _input_value(i) for i in inputs}
  data = {i.name: i.array() for i in inputs}
  recs = []
  for name, op, srcs, arg in ops:
    if name in vals:
      raise ValueError(f"{name} is defined twice")
    if any(s not in vals for s in srcs):
      raise ValueError(f"{name} = {op}{tuple(srcs)}: unknown source")
    if op == "index":
      for it in arg:
        if it[0] == "tensor" and srcs[1 + it[1]] in data:
          d = data[srcs[1 + it[1]]]
          n = vals[srcs[0]].shape[arg.index(it)]
          if d.size and (d.min() < -n or d.max() >= n):
            raise ValueError(f"{name}: index {srcs[1 + it[1]]} out of range for size {n}")
    v = infer(op, [vals[s] for s in srcs], arg)
    if v is None:
      raise ValueError(f"{name} = {op}{tuple(srcs)} with arg {arg!r} is invalid or unsafe for {[vals[s] for s in srcs]}")
    vals[name] = v
    recs.append(Op(name, op, tuple(srcs), arg, v))
  for o in list(outputs) + [x for pair in loss for x in pair]:
    if o not in vals:
      raise ValueError(f"unknown output {o}")
  return Program(tuple(inputs), tuple(recs), tuple(outputs), tuple((o, w) for o, w in loss))


def make_input(name: str, array: Any, requires_grad: bool = False) -> Input:
  """An Input holding a copy of array (its dtype must be one of DTYPES)."""
  a = np.asarray(array)
  dt = "bool" if a.dtype == np.bool_ else str(a.dtype)
  if dt not in DTYPES:
    raise ValueError(f"input {name}: dtype {a.dtype} is not one of {DTYPES}")
  return Input(name, tuple(a.shape), dt, tuple(a.ravel().tolist()), requires_grad)


# *** the hypothesis strategy ***

_FLOAT_CONSTS = (0.5, 2.0, -1.5, 0.25, 3.0, -4.0, 1.0)
_INT_CONSTS = (1, 2, -3, 5, 0)
_DIV_CONSTS = (2.0, 4.0, 0.5, -2.0, 3.0, 1.5)
# positive divisors of // and %: powers of two (lowered to shifts and masks) and others (lowered to multiply-high)
_IDIV_CONSTS = (2, 3, 4, 7, 16, 1, 5)
# uint8 partners that make an add, sub or mul wrap
_UINT8_CONSTS = (1, 2, 200, 5, 255, 0, 128)

# how often each kind of step is drawn (hypothesis shrinks towards the first)
_KINDS = ("binary",) * 5 + ("compare", "where", "where") + ("unary",) * 3 + ("cast",) * 2 + ("movement",) * 6 + ("reduce",) * 3 + \
  ("index", "gather", "matmul", "conv2d", "cumsum", "contiguous", "softmax")


class _Builder:
  def __init__(self, draw: Any, max_size: int, allowed: Sequence[str], dtypes: Sequence[str]) -> None:
    self.draw, self.max_size, self.allowed, self.dtypes = draw, max_size, set(allowed), tuple(dtypes)
    self.inputs: List[Input] = []
    self.ops: List[Op] = []
    self.vals: Dict[str, Value] = {}
    self.rng = np.random.default_rng(draw(_st().integers(0, 2 ** 32 - 1), label="data seed"))

  def fresh_input(self, shape: Tuple[int, ...], dtype: str, requires_grad: bool = True, index_range: Optional[int] = None,
                  negative: bool = False) -> str:
    """A new input; index_range=n makes it indices 0..n-1 (or -n..n-1 with negative)."""
    st = _st()
    n = prod(shape)
    kind = self.draw(st.integers(0, 9), label="input data") if index_range is None else 9
    if index_range is not None:
      a: np.ndarray = self.rng.integers(-index_range if negative else 0, index_range, n)
    elif dtype == "bool":
      a = np.ones(n, np.bool_) if kind == 0 else (np.arange(n) % 2 == 0) if kind < 3 else self.rng.random(n) < 0.5
    elif dtype in INT_DTYPES:
      a = np.ones(n) if kind == 0 else (np.arange(n) % 9) - 4 if kind < 3 else self.rng.integers(-4, 5, n)
      a = a + 4 if dtype == "uint8" and kind else a
    else:
      a = np.ones(n) if kind == 0 else ((np.arange(n) % 17) - 8) * 0.25 if kind < 3 else self.rng.integers(-8, 9, n) * 0.25
    name = _input_name(len(self.inputs))
    inp = Input(name, shape, dtype, tuple(np.asarray(a).astype(_np_dtype(dtype)).ravel().tolist()), requires_grad and dtype == "float32")
    self.inputs.append(inp)
    self.vals[name] = _input_value(inp)
    return name

  def emit(self, op: str, srcs: Sequence[str], arg: Any) -> Optional[str]:
    v = infer(op, [self.vals[s] for s in srcs], arg)
    if v is None or prod(v.shape) > self.max_size:
      return None
    name = f"v{len(self.ops) + 1}"
    self.ops.append(Op(name, op, tuple(srcs), arg, v))
    self.vals[name] = v
    return name

  def pick(self, pred: Callable[[Value], bool], label: str) -> Optional[str]:
    names = [n for n, v in self.vals.items() if pred(v)]
    if not names:
      return None
    # mostly the newest value: programs grow into chains rather than many short branches (which pruning would drop)
    if self.draw(_st().integers(0, 2), label=label) < 2:
      return names[-1]
    return names[self.draw(_st().integers(0, len(names) - 1), label=label)]

  def partner_shape(self, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """A shape that broadcasts with shape: some dims dropped to 1 (or leading ones removed), some 1s widened."""
    st = _st()
    out = []
    for s in shape:
      how = self.draw(st.integers(0, 3), label="partner dim")
      out.append(1 if how == 1 else self.draw(st.integers(2, 4)) if how == 2 and s == 1 else s)
    while out and out[0] == 1 and self.draw(st.booleans(), label="drop leading"):
      out.pop(0)
    return tuple(out)

  def partner(self, name: str, dtype: str, consts: Sequence[Any]) -> Tuple[List[str], Any]:
    """A second operand for name: ([], a constant) or ([value name], None), existing or a fresh input."""
    st = _st()
    how = self.draw(st.integers(0, 2), label="partner kind")
    if how == 0 and consts:
      return [], self.draw(st.sampled_from(list(consts)))
    shape = self.vals[name].shape
    if how == 1:
      other = self.pick(lambda v: v.dtype == dtype and _broadcast(v.shape, shape) is not None and prod(_broadcast(v.shape, shape) or ()) <=
                        self.max_size, "partner")
      if other is not None:
        return [other], None
    pshape = self.partner_shape(shape)
    if prod(_broadcast(pshape, shape) or ()) > self.max_size:
      pshape = shape
    return [self.fresh_input(pshape, dtype)], None

  def make_positive(self, name: str) -> Optional[str]:
    """name, or name*name + 0.5 (at least 0.5) when name may be close to zero or negative."""
    v = self.vals[name]
    if v.lo >= 0.25:
      return name
    sq = self.emit("mul", [name, name], None)
    return self.emit("add", [sq], 0.5) if sq is not None else None


def _input_name(i: int) -> str:
  return "abcdefghijklmnopqrstu"[i] if i < 21 else f"x{i}"


def _st() -> Any:
  from hypothesis import strategies as st
  return st


def _draw_step(b: _Builder, kind: str) -> Optional[str]:
  st, draw = _st(), b.draw
  if kind == "binary":
    op = draw(st.sampled_from([o for o in BINARY_OPS if o in b.allowed] or ["add"]), label="binary op")
    if op in INT_BINARY_OPS:
      return _draw_int_division(b, op)
    x = b.pick(lambda v: v.dtype not in ("bool",) and (op != "div" or v.dtype == "float32"), "lhs")
    if x is None:
      return None
    dt = b.vals[x].dtype
    srcs, const = b.partner(x, dt, _DIV_CONSTS if op == "div" else _FLOAT_CONSTS if dt in FLOAT_DTYPES else
                            _UINT8_CONSTS if dt == "uint8" else _INT_CONSTS)
    if op == "div" and srcs:
      pos = b.make_positive(srcs[0])
      if pos is None:
        return None
      srcs = [pos]
    return b.emit(op, [x] + srcs, const)
  if kind == "compare":
    op = draw(st.sampled_from(COMPARE_OPS), label="compare op")
    x = b.pick(lambda v: v.exact and (v.dtype != "bool" or op in ("eq", "ne")), "lhs")
    if x is None:
      return None
    dt = b.vals[x].dtype
    srcs, const = b.partner(x, dt, (_FLOAT_CONSTS if dt in FLOAT_DTYPES else _INT_CONSTS) if dt != "bool" else ())
    return b.emit(op, [x] + srcs, const)
  if kind == "where":
    x = b.pick(lambda v: v.dtype != "bool", "where value")
    if x is None:
      return None
    dt, xshape = b.vals[x].dtype, b.vals[x].shape
    cond = b.pick(lambda v: v.dtype == "bool" and _broadcast(v.shape, xshape) is not None, "cond")
    if cond is None or draw(st.booleans(), label="fresh cond"):
      cond = b.fresh_input(b.partner_shape(xshape), "bool")
    srcs, const = b.partner(x, dt, _FLOAT_CONSTS if dt in FLOAT_DTYPES else _INT_CONSTS)
    return b.emit("where", [cond, x] + srcs, const)
  if kind == "unary":
    op = draw(st.sampled_from([o for o in UNARY_OPS if o in b.allowed] or ["neg"]), label="unary op")
    x = b.pick(lambda v: v.dtype == "float32" or (op == "neg" and v.dtype in ("int32", "float16", "float64", "int8", "int64")), "src")
    if x is None:
      return None
    if op in ("log", "sqrt"):
      x = b.make_positive(x)
    elif op == "exp" and b.vals[x].hi > 8:
      # scale down by a power of two (keeps exactness)
      x = b.emit("mul", [x], 2.0 ** -math.ceil(math.log2(b.vals[x].hi / 8)))
    return b.emit(op, [x], None) if x is not None else None
  if kind == "cast":
    x = b.pick(lambda v: True, "src")
    assert x is not None
    src = b.vals[x]
    targets = [d for d in (MAIN_DTYPES if draw(st.integers(0, 2), label="narrow cast") else DTYPES) if d != src.dtype and d in b.dtypes]
    return b.emit("cast", [x], draw(st.sampled_from(targets), label="cast to")) if targets else None
  if kind == "contiguous":
    x = b.pick(lambda v: True, "src")
    return b.emit("contiguous", [x], None) if x is not None else None
  if kind == "movement":
    from tiny.testing.strategies import movement_op
    x = b.pick(lambda v: True, "src")
    assert x is not None
    shape = b.vals[x].shape
    if not shape:
      return b.emit("reshape", [x], (1,) * draw(st.integers(1, 2)))
    kind_, arg = draw(movement_op(shape, max_size=b.max_size), label="movement")
    return b.emit(kind_, [x], tuple(arg))
  if kind == "reduce":
    op = draw(st.sampled_from(REDUCE_OPS), label="reduce op")
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype in ("float32", "int32") and (op != "mean" or v.dtype == "float32"), "src")
    if x is None:
      return None
    nd = len(b.vals[x].shape)
    axes = None if draw(st.integers(0, 4), label="all axes") == 0 else \
        tuple(sorted(draw(st.sets(st.integers(0, nd - 1), min_size=1, max_size=nd), label="axes")))
    return b.emit(op, [x], (axes, draw(st.booleans(), label="keepdim")))
  if kind == "softmax":
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype == "float32" and v.hi - v.lo <= 30, "src")
    op = draw(st.sampled_from([o for o in ("softmax", "log_softmax") if o in b.allowed]), label="softmax op")
    return b.emit(op, [x], draw(st.integers(0, len(b.vals[x].shape) - 1), label="axis")) if x is not None else None
  if kind == "cumsum":
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype in ("float32", "int32"), "src")
    return b.emit("cumsum", [x], draw(st.integers(0, len(b.vals[x].shape) - 1))) if x is not None else None
  if kind == "index":
    x = b.pick(lambda v: len(v.shape) > 0, "src")
    if x is None:
      return None
    shape = b.vals[x].shape
    items: List[Any] = []
    tensors: List[str] = []
    use_tensor = draw(st.booleans(), label="tensor index")
    for d in range(draw(st.integers(1, len(shape)), label="indexed dims")):
      n = shape[d]
      how = draw(st.integers(0, 2), label="index kind")
      if how == 2 and use_tensor and len(tensors) < 2:
        ishape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2), label="index shape")) if not tensors else \
            b.inputs[[i.name for i in b.inputs].index(tensors[0])].shape
        # negative indices count from the end, as in numpy (gather takes none: torch's rule)
        tensors.append(b.fresh_input(ishape, "int32", requires_grad=False, index_range=n, negative=draw(st.booleans(), label="negative")))
        items.append(("tensor", len(tensors) - 1))
      elif how == 1 and not use_tensor:
        items.append(("int", draw(st.integers(-n, n - 1), label="int index")))
      else:
        step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]), label="step")
        start = draw(st.one_of(st.none(), st.integers(-n, n - 1)), label="start")
        stop = draw(st.one_of(st.none(), st.integers(-n, n)), label="stop")
        items.append(("slice", start, stop, step))
    return b.emit("index", [x] + tensors, tuple(items))
  if kind == "gather":
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype in ("float32", "int32"), "src")
    if x is None:
      return None
    shape = b.vals[x].shape
    dim = draw(st.integers(0, len(shape) - 1), label="dim")
    ishape = tuple(draw(st.integers(1, 4)) if i == dim else draw(st.integers(1, s)) for i, s in enumerate(shape))
    return b.emit("gather", [x, b.fresh_input(ishape, "int32", requires_grad=False, index_range=shape[dim])], dim)
  if kind == "matmul":
    x = b.pick(lambda v: len(v.shape) > 0 and v.dtype == "float32", "src")
    if x is None:
      return None
    shape, m = b.vals[x].shape, draw(st.one_of(st.integers(1, 6), st.sampled_from([16, 32])), label="m")
    if len(shape) >= 2 and draw(st.booleans(), label="weight on the left"):
      return b.emit("matmul", [b.fresh_input((m, shape[-2]), "float32"), x], None)
    wshape = (shape[-1], m) if draw(st.integers(0, 3), label="vector weight") else (shape[-1],)
    return b.emit("matmul", [x, b.fresh_input(wshape, "float32")], None)
  if kind == "conv2d":
    x = b.pick(lambda v: v.dtype == "float32" and 0 < len(v.shape) <= 4, "src")
    if x is None:
      return None
    shape = b.vals[x].shape
    if len(shape) < 4:
      x4 = b.emit("reshape", [x], (1,) * (4 - len(shape)) + shape)
      if x4 is None:
        return None
      x, shape = x4, (1,) * (4 - len(shape)) + shape
    cin = shape[1]
    groups = draw(st.sampled_from([g for g in (1, 2, 3) if cin % g == 0]), label="groups")
    cout = groups * draw(st.integers(1, 3), label="cout per group")
    stride, padding = draw(st.integers(1, 2), label="stride"), draw(st.integers(0, 1), label="padding")
    dilation = draw(st.integers(1, 2), label="dilation")
    # kernel sizes that fit the padded image
    kh, kw = [draw(st.integers(1, max(1, min(3, (d + 2 * padding - 1) // dilation + 1))), label="kernel") for d in shape[2:]]
    arg = (stride, padding, dilation, groups)
    w = b.fresh_input((cout, cin // groups, kh, kw), "float32")
    srcs = [x, w] + ([b.fresh_input((cout,), "float32")] if draw(st.booleans(), label="bias") else [])
    return b.emit("conv2d", srcs, arg)
  raise ValueError(f"unknown step kind {kind}")


def _draw_int_division(b: _Builder, op: str) -> Optional[str]:
  """x // y or x % y for an int x (an exact non-int value is cast to int32 first, and x is sometimes cast to another
  int dtype), by a positive constant or by a tensor made non-zero: y.maximum(1), negated half the time where the dtype
  is signed."""
  st, draw = _st(), b.draw
  x = b.pick(lambda v: v.dtype in INT_DTYPES, "lhs")
  if x is None:
    src = b.pick(lambda v: v.exact and v.dtype in ("float32", "bool"), "lhs to cast")
    x = b.emit("cast", [src], "int32") if src is not None else None
    if x is None:
      return None
  narrow = draw(st.sampled_from([None, "int8", "uint8", "int64"]), label="int division dtype")
  if narrow is not None and narrow != b.vals[x].dtype and narrow in b.dtypes:
    x = b.emit("cast", [x], narrow) or x
  dt = b.vals[x].dtype
  if draw(st.booleans(), label="offset before dividing"):
    # (x + c) // d and (x * c + e) % d are what the symbolic folds rewrite; uint8 constants make the sum wrap
    how = draw(st.sampled_from(["add", "mul", "sub"]), label="offset op")
    x = b.emit(how, [x], draw(st.sampled_from(_UINT8_CONSTS if dt == "uint8" else _INT_CONSTS), label="offset")) or x
  srcs, const = b.partner(x, dt, _IDIV_CONSTS)
  if srcs:
    y: Optional[str] = srcs[0]
    if not (b.vals[srcs[0]].lo > 0 or b.vals[srcs[0]].hi < 0):
      y = b.emit("maximum", srcs, 1)
      if y is not None and dt != "uint8" and draw(st.booleans(), label="negative divisor"):
        y = b.emit("neg", [y], None)
    if y is None:
      return None
    srcs = [y]
  return b.emit(op, [x] + srcs, const)


def _prune(p: Program) -> Program:
  """Drop ops and inputs nothing that is compared depends on; rename what is left densely (a, b, ... and v1, v2, ...)."""
  ops = {o.name: o for o in p.ops}
  needed: set = set()
  todo = list(p.outputs) + [x for pair in p.loss for x in pair]
  while todo:
    n = todo.pop()
    if n not in needed:
      needed.add(n)
      todo.extend(ops[n].srcs if n in ops else ())
  inputs = [i for i in p.inputs if i.name in needed]
  kept = [o for o in p.ops if o.name in needed]
  names = {i.name: _input_name(k) for k, i in enumerate(inputs)}
  names.update({o.name: f"v{k + 1}" for k, o in enumerate(kept)})
  return Program(tuple(replace(i, name=names[i.name]) for i in inputs),
                 tuple(replace(o, name=names[o.name], srcs=tuple(names[s] for s in o.srcs)) for o in kept),
                 tuple(names[o] for o in p.outputs), tuple((names[o], names[w]) for o, w in p.loss))


def programs(max_inputs: int = 3, max_ops: int = 10, max_size: int = 128, max_side: int = 8, backward: bool = True,
             ops: Sequence[str] = ALL_OPS, min_ops: int = 2, dtypes: Sequence[str] = DTYPES) -> st.SearchStrategy[Program]:
  """Hypothesis strategy of small random `Program`s.

  max_inputs: starting inputs (ops add more: partners, weights, indices); min_ops..max_ops: steps drawn (helper ops such as the
  reshape before a conv come on top); max_size: elements of any value; max_side: largest starting dim; backward: may
  add a loss and compare gradients; ops: the op names (of ALL_OPS) that may be drawn (a family such as the movement
  ops is drawn while one of its members is allowed; helper ops like the reshape before a conv are always allowed);
  dtypes: the dtype names (of DTYPES, float32 required) values may have, for a device without some of them."""
  st = _st()
  allowed = tuple(ops)
  if "float32" not in dtypes or any(d not in DTYPES for d in dtypes):
    raise ValueError(f"programs(): dtypes must be names of {DTYPES} including float32, got {dtypes}")
  input_dtypes = [d for d in ("float32",) * 4 + ("int32", "bool", "uint8") if d in dtypes]
  kinds = [k for k in _KINDS if _kind_allowed(k, allowed)]
  if not kinds:
    raise ValueError(f"programs(): no op family left of {ops}")

  @st.composite
  def strat(draw: Any) -> Program:
    b = _Builder(draw, max_size, allowed, dtypes)
    for _ in range(draw(st.integers(1, max_inputs), label="inputs")):
      # now and then a long dim (16 or 32): wide enough for the vector-width upcasts and unrolls of the CPU heuristics
      side = st.one_of(st.integers(1, max_side), st.sampled_from([16, 32]))
      shape = tuple(draw(st.lists(side, min_size=1, max_size=4).filter(lambda s: prod(s) <= max_size), label="shape"))
      dt = input_dtypes[draw(st.integers(0, len(input_dtypes) - 1), label="input dtype")]
      b.fresh_input(shape, dt)
    for _ in range(draw(st.integers(min_ops, max_ops), label="ops")):
      _draw_step(b, draw(st.sampled_from(kinds), label="step"))
    for _ in range(8):   # every step may have found nothing to apply to; a program without ops tests nothing
      if b.ops:
        break
      _draw_step(b, draw(st.sampled_from(kinds), label="step"))
    candidates = [o.name for o in b.ops] or [i.name for i in b.inputs]
    outputs = [candidates[-1]]
    for _ in range(draw(st.integers(0, 2), label="more outputs")):
      o = candidates[draw(st.integers(0, len(candidates) - 1), label="output")]
      if o not in outputs:
        outputs.append(o)
    loss: List[Tuple[str, str]] = []
    if backward and draw(st.booleans(), label="backward"):
      for o in outputs:
        v = b.vals[o]
        if v.dtype == "float32" and v.grad and v.grad_safe:
          loss.append((o, b.fresh_input(v.shape, "float32", requires_grad=False)))
    p = Program(tuple(b.inputs), tuple(b.ops), tuple(outputs), tuple(loss))
    if loss and not p.grad_inputs:
      p = replace(p, loss=())
    return _prune(p)
  return strat()


def _kind_allowed(kind: str, ops: Sequence[str]) -> bool:
  fam = {"binary": BINARY_OPS, "compare": COMPARE_OPS, "unary": UNARY_OPS, "movement": MOVEMENT_OPS, "reduce": REDUCE_OPS,
         "softmax": ("softmax", "log_softmax")}
  return any(o in ops for o in fam.get(kind, (kind,)))


# *** references ***

def torch_available() -> bool:
  """torch can be imported (it is only imported when a reference needs it)."""
  try:
    import torch  # noqa: F401
  except ImportError:
    return False
  return True


def reference_results(program: Program, backend: str = "auto") -> Dict[str, np.ndarray]:
  """The expected results (keys: `Program.result_names`) computed by torch or numpy. backend: "torch", "numpy" or
  "auto" (torch when importable). numpy computes no gradients: with it only the outputs are returned."""
  if backend == "auto":
    backend = "torch" if torch_available() else "numpy"
  if backend == "torch":
    return _torch_results(program)
  if backend == "numpy":
    return _numpy_results(program)
  raise ValueError(f"unknown reference backend {backend!r}: use 'torch', 'numpy' or 'auto'")


def _numpy_results(p: Program) -> Dict[str, np.ndarray]:
  env: Dict[str, Any] = {i.name: i.array() for i in p.inputs}
  # uint8 add/sub/mul may wrap on purpose (numpy warns about that only for 0-d operands)
  with np.errstate(over="ignore"):
    for o in p.ops:
      env[o.name] = np.asarray(_numpy_op(o, [env[s] for s in o.srcs])).astype(_np_dtype(o.value.dtype))
  return {o: np.asarray(env[o]) for o in p.outputs}


def _numpy_conv2d(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], stride: int, padding: int, dilation: int, groups: int) -> np.ndarray:
  n, cin, h, wd = x.shape
  cout, cing, kh, kw = w.shape
  xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  oh, ow = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1, (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
  out = np.zeros((n, cout, oh, ow), dtype=np.float64)
  per = cout // groups
  for g in range(groups):
    xs, ws = xp[:, g * cing:(g + 1) * cing], w[g * per:(g + 1) * per]
    for i, j in itertools.product(range(kh), range(kw)):
      patch = xs[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride, j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
      out[:, g * per:(g + 1) * per] += np.einsum("nchw,oc->nohw", patch.astype(np.float64), ws[:, :, i, j].astype(np.float64))
  if b is not None:
    out += b.reshape(1, -1, 1, 1)
  return out.astype(x.dtype)


def _numpy_op(o: Op, s: List[Any]) -> Any:
  from tiny.testing.strategies import apply_to_numpy
  k, arg = o.op, o.arg
  if k in BINARY_OPS or k in COMPARE_OPS:
    x = s[0]
    y = s[1] if len(s) > 1 else np.asarray(arg, dtype=x.dtype)
    fn: Dict[str, Callable[[Any, Any], Any]] = {
      "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
      "floordiv": np.floor_divide, "mod": np.remainder, "lt": np.less, "gt": np.greater, "eq": np.equal, "ne": np.not_equal}
    return fn[k](x, y)
  if k in UNARY_OPS:
    un: Dict[str, Callable[[Any], Any]] = {"neg": np.negative, "relu": lambda x: np.maximum(x, 0), "exp": np.exp, "log": np.log, "sqrt": np.sqrt}
    return un[k](s[0])
  if k == "where":
    return np.where(s[0], s[1], s[2] if len(s) > 2 else np.asarray(arg, dtype=s[1].dtype))
  if k == "cast":
    return s[0].astype(_np_dtype(arg))
  if k == "contiguous":
    return s[0]
  if k in MOVEMENT_OPS:
    return apply_to_numpy(s[0], [(k, arg)], pad_value=0)
  if k == "index":
    return s[0][_numpy_index(arg, s[1:])]
  if k in REDUCE_OPS:
    axes, keepdim = arg
    reds: Dict[str, Callable[..., Any]] = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}
    fn2 = reds[k]
    return fn2(s[0], axis=axes, keepdims=keepdim)
  if k == "cumsum":
    return np.cumsum(s[0], axis=arg)
  if k in ("softmax", "log_softmax"):
    d = s[0] - np.max(s[0], axis=arg, keepdims=True)
    e = np.exp(d)
    return e / np.sum(e, axis=arg, keepdims=True) if k == "softmax" else d - np.log(np.sum(e, axis=arg, keepdims=True))
  if k == "gather":
    x, idx = s
    x = x[tuple(slice(0, n) if d != arg else slice(None) for d, n in enumerate(idx.shape))]
    return np.take_along_axis(x, idx.astype(np.int64), axis=arg)
  if k == "matmul":
    return np.matmul(s[0], s[1])
  if k == "conv2d":
    return _numpy_conv2d(s[0], s[1], s[2] if len(s) > 2 else None, *arg)
  raise ValueError(f"unknown op {k!r}")


def _torch_results(p: Program) -> Dict[str, np.ndarray]:
  import torch
  tdt = {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "int32": torch.int32, "int8": torch.int8,
         "uint8": torch.uint8, "int64": torch.int64, "bool": torch.bool}
  grads = set(p.grad_inputs)
  env: Dict[str, Any] = {}
  for i in p.inputs:
    env[i.name] = torch.tensor(i.array()).requires_grad_(i.name in grads)
  for o in p.ops:
    env[o.name] = _torch_op(torch, o, [env[s] for s in o.srcs], tdt).to(tdt[o.value.dtype])
  out = {o: env[o].detach().numpy().copy() for o in p.outputs}
  if p.loss:
    loss = sum(((env[o] * env[w]).sum() for o, w in p.loss), torch.zeros((), dtype=torch.float32))
    loss.backward()
    for x in p.grad_inputs:
      g = env[x].grad
      out[f"grad({x})"] = (g if g is not None else torch.zeros_like(env[x])).numpy().copy()
  return out


def _torch_op(torch: Any, o: Op, s: List[Any], tdt: Dict[str, Any]) -> Any:
  F = torch.nn.functional  # noqa: N806
  k, arg = o.op, o.arg
  if k in BINARY_OPS or k in COMPARE_OPS:
    x = s[0]
    y = s[1] if len(s) > 1 else torch.tensor(arg, dtype=x.dtype)
    fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum,
          "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"), "mod": torch.remainder,
          "lt": torch.lt, "gt": torch.gt, "eq": torch.eq, "ne": torch.ne}[k]
    return fn(x, y)
  if k in UNARY_OPS:
    return {"neg": torch.neg, "relu": torch.relu, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt}[k](s[0])
  if k == "where":
    return torch.where(s[0], s[1], s[2] if len(s) > 2 else torch.tensor(arg, dtype=s[1].dtype))
  if k == "cast":
    return s[0].to(tdt[arg])
  if k == "contiguous":
    return s[0]
  x = s[0]
  if k == "reshape":
    return x.reshape(arg)
  if k == "permute":
    return x.permute(arg)
  if k == "expand":
    return x.expand(arg)
  if k == "pad":
    flat = [v for be in reversed(arg) for v in be]
    return F.pad(x, flat) if any(flat) else x
  if k == "shrink":
    return x[tuple(slice(b, e) for b, e in arg)]
  if k == "flip":
    return torch.flip(x, tuple(arg))
  if k == "stride":
    neg = tuple(d for d, m in enumerate(arg) if m < 0)
    if neg:
      x = torch.flip(x, neg)
    return x[tuple(slice(None, None, abs(m)) for m in arg)]
  if k == "index":
    # torch slices take no negative steps: select each slice's elements explicitly first (keeps the dims)
    spec: List[Any] = []
    for d, it in enumerate(arg):
      if it[0] == "slice":
        idx = list(range(*slice(*it[1:]).indices(x.shape[d])))
        x = torch.index_select(x, d, torch.tensor(idx, dtype=torch.int64))
        spec.append(slice(None))
      elif it[0] == "int":
        spec.append(it[1])
      else:
        spec.append(s[1 + it[1]].to(torch.int64))
    return x[tuple(spec)]
  if k in REDUCE_OPS:
    axes, keepdim = arg
    dims = tuple(range(x.ndim)) if axes is None else tuple(axes)
    if k == "sum":
      return torch.sum(x, dim=dims, keepdim=keepdim)
    if k == "mean":
      return torch.mean(x, dim=dims, keepdim=keepdim)
    # amax/amin share the gradient evenly between ties, as tiny does
    return (torch.amax if k == "max" else torch.amin)(x, dim=dims, keepdim=keepdim)
  if k == "cumsum":
    return torch.cumsum(x, dim=arg)
  if k == "softmax":
    return torch.softmax(x, dim=arg)
  if k == "log_softmax":
    return torch.log_softmax(x, dim=arg)
  if k == "gather":
    return torch.gather(x, arg, s[1].to(torch.int64))
  if k == "matmul":
    return torch.matmul(s[0], s[1])
  if k == "conv2d":
    stride, padding, dilation, groups = arg
    return F.conv2d(s[0], s[1], s[2] if len(s) > 2 else None, stride=stride, padding=padding, dilation=dilation, groups=groups)
  raise ValueError(f"unknown op {k!r}")


# *** running on tiny under an opt setting ***

@dataclass(frozen=True)
class OptSetting:
  """How each kernel of a program is optimized.

  kind: "noopt" (NOOPT=1), "heuristic" (the default hand-coded opts), "random" (random valid opts on top of the
  required ones), "heuristic+random" (random valid opts on top of the heuristic's), or "given" (opts: the exact opt
  list of each kernel, in schedule order). seed, max_opts (1..max_opts random opts per kernel) and max_upcast (the
  largest product of upcast and unrolled dims a random opt may create) drive the random kinds."""

  kind: str
  seed: int = 0
  max_opts: int = 4
  opts: Tuple[Tuple[Any, ...], ...] = ()
  max_upcast: int = 64

  def __post_init__(self) -> None:
    if self.kind not in ("noopt", "heuristic", "random", "heuristic+random", "given"):
      raise ValueError(f"unknown OptSetting kind {self.kind!r}")

  def __str__(self) -> str:
    return self.kind + (f"(seed={self.seed}, max_opts={self.max_opts})" if "random" in self.kind else "")


def default_settings(seed: int = 0, n_random: int = 2, max_opts: int = 4, max_upcast: int = 64) -> List[OptSetting]:
  """NOOPT, the heuristic, and n_random random settings (alternately from scratch and on top of the heuristic)."""
  out = [OptSetting("noopt"), OptSetting("heuristic")]
  for i in range(n_random):
    out.append(OptSetting("random" if i % 2 == 0 else "heuristic+random", seed + i, max_opts, max_upcast=max_upcast))
  return out


@dataclass(frozen=True)
class KernelRecord:
  """One kernel as it ran: its name (the colored shape, without colors) and the opts applied to it."""

  name: str
  opts: Tuple[Any, ...]


_ACTIONS: List[Any] = []


def opt_actions() -> List[Any]:
  """The opts a random setting picks from: BEAM's action list plus small amounts that fit the fuzzer's small shapes
  (BEAM's PADTO 32 never applies to a dim under 9, for example)."""
  if not _ACTIONS:
    # 16: a whole AVX-512 register of float32 lanes, what the CPU vectorizer packs
    extra = [Opt(OptOps.UPCAST, a, n) for n in (6, 16) for a in range(4)] + [Opt(OptOps.UNROLL, a, n) for n in (3, 5, 6, 16) for a in range(3)]
    extra += [Opt(OptOps.PADTO, a, n) for n in (4, 8) for a in range(5)] + [Opt(OptOps.LOCAL, a, n) for n in (5, 6) for a in range(3)]
    extra += [Opt(OptOps.GROUP, a, n) for n in (2, 3) for a in range(2)] + [Opt(OptOps.GROUPTOP, a, n) for n in (2, 4) for a in range(2)]
    _ACTIONS.extend(dict.fromkeys(list(actions()) + extra))
  return _ACTIONS


def _upcast_size(k: Kernel) -> int:
  return prod(k.full_shape[k.first_upcast:]) if k.upcasted else 1


class OptApplyError(Exception):
  """Kernel.apply_opt failed with something other than the errors that mean "does not apply" (BEAM's filter): kernel
  is the kernel's name and opts its opts up to and including the one that failed."""

  def __init__(self, kernel: str, opts: Tuple[Any, ...]) -> None:
    super().__init__(f"applying {opts[-1]} to {kernel} (after {list(opts[:-1])}) failed")
    self.kernel, self.opts = kernel, opts


def apply_random_opts(k: Kernel, rng: random.Random, n: int, max_upcast: int = 64) -> Kernel:
  """Apply up to n opts drawn from `opt_actions()` that apply to k (each one valid for the kernel as it is then);
  stops early when none applies. Returns the new kernel (k is not changed). Raises OptApplyError when apply_opt
  fails in an unexpected way."""
  acts = opt_actions()
  for _ in range(n):
    order = list(range(len(acts)))
    rng.shuffle(order)
    for i in order:
      k2 = k.copy()
      try:
        k2.apply_opt(acts[i])
      except (KernelOptError, AssertionError, IndexError, ValueError, ZeroDivisionError):
        continue
      except Exception as e:
        raise OptApplyError(ansistrip(k.name), tuple(k.applied_opts) + (acts[i],)) from e
      if _upcast_size(k2) <= max_upcast:
        k = k2
        break
    else:
      break
  return k


def setting_chooser(setting: OptSetting) -> Callable[[LazyOp, Renderer], Kernel]:
  """A function (ast, renderer) -> optimized Kernel for setting; called for the kernels of a schedule in order."""
  rng = random.Random(setting.seed)
  count = itertools.count()

  def choose(ast: LazyOp, renderer: Renderer) -> Kernel:
    i = next(count)
    if setting.kind in ("noopt", "heuristic"):
      with Context(NOOPT=int(setting.kind == "noopt"), BEAM=0):
        return get_kernel(renderer, ast)
    if setting.kind == "given":
      k = Kernel(ast, opts=renderer)
      if i >= len(setting.opts):
        raise ValueError(f"the schedule has more kernels than the {len(setting.opts)} opt lists given")
      return k.apply_opts(setting.opts[i])
    k = Kernel(ast, opts=renderer)
    k = k.hand_coded_optimizations() if setting.kind == "heuristic+random" else k.required_optimizations()
    return apply_random_opts(k, rng, rng.randint(1, setting.max_opts), setting.max_upcast)
  return choose


def realize_with_opts(tensors: Sequence[Tensor], opts: Union[Sequence[Sequence[Opt]], OptSetting, Callable[..., Any], None] = None,
                      records: Optional[List[KernelRecord]] = None) -> List[KernelRecord]:
  """Realize tensors, building every kernel of their schedule without the method cache: opts is the opt list of each
  kernel in schedule order (as printed in a reproducer), an OptSetting, or a function (ast, renderer) -> Kernel; None
  is the default heuristic. Returns what ran: each kernel's name and applied opts.

  Non-kernel items (copies, views) run as usual. Nothing is cached, so a later plain realize of the same program is
  not affected; the kernels it loaded are unloaded before it returns (see `_unload`). records, when given, is the
  list kernels are appended to as they are built (so it tells how far a run got when it raises; a kernel whose opts
  failed to apply is in it with the failing opt last)."""
  if opts is None:
    opts = OptSetting("heuristic")
  if isinstance(opts, OptSetting):
    choose = setting_chooser(opts)
  elif callable(opts):
    choose = opts
  else:
    choose = setting_chooser(OptSetting("given", opts=tuple(tuple(o) for o in opts)))
  if records is None:
    records = []
  if not tensors:
    return records
  loaded: List[CompiledRunner] = []
  with realize_lock:
    try:
      _run_schedule_with(tensors[0].schedule(*tensors[1:]), choose, records, loaded)
    finally:
      for runner in loaded:
        _unload(runner)
    if isinstance(opts, (list, tuple)) and len(records) != len(opts):
      raise ValueError(f"opts has {len(opts)} lists for a schedule of {len(records)} kernels")
  return records


def _run_schedule_with(schedule: List[Any], choose: Callable[..., Any], records: List[KernelRecord], loaded: List[Any]) -> None:
  for si in schedule:
    if si.ast.op is MetaOps.KERNEL:
      # this run is the item's: the result read back must be this kernel's, not the item run again as pending
      pending.claim(si)
      dname = si.outputs[0].device
      try:
        k: Kernel = choose(si.ast, Device[dname].renderer)
      except OptApplyError as e:
        records.append(KernelRecord(e.kernel, e.opts))
        raise
      records.append(KernelRecord(ansistrip(k.name), tuple(k.applied_opts)))
      runner = CompiledRunner(replace(k.to_program(), dname=dname))
      loaded.append(runner)
      ei = ExecItem(runner, [si.bufs[g[0] if isinstance(g, tuple) else g] for g in runner.p.globals], si.metadata)
    else:
      ei = lower_schedule_item(si)
    ei.run()


def _unload(runner: Any) -> None:
  """dlclose a kernel's shared object when its program holds one (CLANG's ClangProgram keeps every .so it loads mapped
  for the life of the process: a long fuzz run loads tens of thousands and runs out of memory mappings, then fails
  with "cannot apply additional memory protection after relocation"). The runner must not be called afterwards."""
  import ctypes
  so = getattr(getattr(runner, "clprg", None), "so", None)
  if isinstance(so, ctypes.CDLL) and getattr(so, "_handle", None):
    libdl = ctypes.CDLL(None)
    libdl.dlclose.argtypes = [ctypes.c_void_p]
    libdl.dlclose(so._handle)
    so._handle = 0


@dataclass
class ProgramRun:
  """The results of one run of a program on tiny (keys: `Program.result_names`), the kernels that ran, and the
  exception when it failed (results then hold what was read before it)."""

  results: Dict[str, np.ndarray]
  kernels: List[KernelRecord] = field(default_factory=list)
  error: Optional[BaseException] = None
  dtypes: Dict[str, Any] = field(default_factory=dict)


def run_program(program: Program, device: str, setting: OptSetting = OptSetting("heuristic")) -> ProgramRun:
  """Run program on device with every kernel optimized as setting says. An exception is caught into the result."""
  ns: Dict[str, Any] = {"Tensor": Tensor, "dtypes": dtypes, "np": np, "DEVICE": device}
  run = ProgramRun({})
  try:
    exec("\n".join(program.source()), ns)
    tensors = eval(program.result_source(), ns)
    names = program.result_names()
    for n, t in zip(names, tensors):
      if t is None:
        raise AssertionError(f"tiny computed no gradient for {n}")
    targets = [t.contiguous() for t in tensors]
    realize_with_opts(targets, setting, records=run.kernels)
    for n, t in zip(names, targets):
      run.results[n] = t.numpy()
      run.dtypes[n] = t.dtype
  except Exception as e:  # noqa: BLE001  a crash is a finding too: it is reported with the reproducer
    run.error = e
  return run


# *** comparing and reporting ***

@dataclass(frozen=True)
class Mismatch:
  """Where a run differs from the reference: the result name and a one-line description."""

  name: str
  message: str


def tolerance(program: Program, name: str) -> Tuple[float, float]:
  """(rtol, atol scale) for result name: (0, 0) for exact values, else the dtype's tolerance (atol is that times the
  largest expected magnitude, at least 1). Rounding happens in float32 ops only (transcendentals, divisions), so a
  float64 value is never compared tighter than float32's tolerance."""
  vals = program.values()
  if name.startswith("grad("):
    return _TOL["float32"], _TOL["float32"]
  v = vals[name]
  if v.exact:
    return 0.0, 0.0
  tol = max(_TOL[v.dtype], _TOL["float32"])
  return tol, tol


def compare_results(program: Program, got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]) -> List[Mismatch]:
  """Every result of want that got lacks or gets wrong (shape, values; bools and ints exactly, floats as `tolerance`)."""
  out = []
  for name, w in want.items():
    if name not in got:
      out.append(Mismatch(name, "missing from the run"))
      continue
    g = np.asarray(got[name])
    if g.shape != w.shape:
      out.append(Mismatch(name, f"shape {g.shape}, expected {w.shape}"))
      continue
    rtol, ascale = tolerance(program, name)
    if w.dtype.kind == "f":
      gf, wf = g.astype(np.float64), w.astype(np.float64)
      atol = ascale * max(1.0, float(np.max(np.abs(wf)))) if wf.size else 0.0
      bad = ~(np.abs(gf - wf) <= atol + rtol * np.abs(wf))
    else:
      bad = g.astype(w.dtype) != w
    if np.any(bad):
      pos = [tuple(int(i) for i in p) for p in np.argwhere(bad)[:4]]
      diff = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
      first = ", ".join(f"{p}: got {g[p]!r} want {w[p]!r}" for p in pos)
      out.append(Mismatch(name, f"{int(np.sum(bad))} of {w.size} elements differ (max abs diff {diff:g}, rtol {rtol:g}, atol scale {ascale:g}); "
                                f"first {first}"))
  return out


def _array_source(a: np.ndarray) -> str:
  npdt = "np.bool_" if a.dtype == np.bool_ else f"np.{a.dtype}"
  return f"np.array({a.ravel().tolist()!r}, dtype={npdt}).reshape({a.shape})"


def reproducer(program: Program, device: str, setting: OptSetting, run: ProgramRun, want: Dict[str, np.ndarray],
               mismatches: Sequence[Mismatch] = (), backend: str = "") -> str:
  """A runnable Python script reproducing a run: the program with literal inputs on device, realized with the opts
  each kernel got, then compared with the reference values; comments say what differed (or what was raised)."""
  lines = [f"# tiny program fuzz: device {device}, opt setting {setting}" + (f", reference {backend}" if backend else "")]
  err: Optional[BaseException] = run.error
  while err is not None:
    lines.append(f"# raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
    # innermost frames, each place once (a recursion shows up as the few frames it cycles through)
    frames = list(dict.fromkeys(f"{fr.filename.split('/src/')[-1]}:{fr.lineno} in {fr.name}" for fr in traceback.extract_tb(err.__traceback__)))
    lines += [f"#   {fr}" for fr in frames[-8:]]
    err = err.__cause__
    if err is not None:
      lines.append("# caused by:")
  for m in mismatches:
    lines.append(f"# {m.name}: {m.message}")
  lines.append("# kernels in schedule order, with the opts applied to each:")
  lines += [f"#   {i} {k.name}: {list(k.opts)}" for i, k in enumerate(run.kernels)] or ["#   (none ran)"]
  lines += ["import numpy as np", "from tiny.codegen.kernel import Opt, OptOps", "from tiny.dtype import dtypes", "from tiny.tensor import Tensor",
            "from tiny.testing.program_fuzz import OptSetting, realize_with_opts", f"DEVICE = {device!r}"]
  lines += program.source()
  lines.append(f"results = [t.contiguous() for t in {program.result_source()}]")
  if not run.kernels:
    lines.append(f"realize_with_opts(results, {setting!r})  # no kernel was built before the error")
  else:
    lines.append(f"realize_with_opts(results, {[list(k.opts) for k in run.kernels]!r})")
  for i, name in enumerate(program.result_names()):
    if name not in want:
      continue
    rtol, ascale = tolerance(program, name)
    w = want[name]
    if w.dtype.kind != "f" or (rtol == 0 and ascale == 0):
      lines.append(f"np.testing.assert_array_equal(results[{i}].numpy(), {_array_source(w)}, err_msg={name!r})")
    else:
      atol = ascale * max(1.0, float(np.max(np.abs(w.astype(np.float64))))) if w.size else 0.0
      lines.append(f"np.testing.assert_allclose(results[{i}].numpy(), {_array_source(w)}, rtol={rtol!r}, atol={atol!r}, err_msg={name!r})")
  return "\n".join(lines) + "\n"


_last_failed_kind: Dict[str, str] = {}


def check_program(program: Program, device: str, settings: Sequence[OptSetting], backend: str = "auto",
                  want: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
  """Run program on device under every setting and compare with the reference (computed once, or `want`).

  Raises AssertionError with a `reproducer` as its message at the first setting that fails (wrong value, shape or
  dtype, or an exception). Without torch (or with backend="numpy") gradients are not checked. Returns the reference."""
  if backend == "auto":
    backend = "torch" if torch_available() else "numpy"
  if want is None:
    want = reference_results(program, backend)
  vals = program.values()
  # the kind of setting that failed last goes first: while hypothesis shrinks a failure, each smaller candidate then
  # fails (or passes that setting) without running the others first
  failed_kind = _last_failed_kind.get(device)
  for setting in sorted(settings, key=lambda x: x.kind != failed_kind):
    run = run_program(program, device, setting)
    mism = compare_results(program, run.results, want) if run.error is None else []
    for name in program.outputs:
      if run.error is None and run.dtypes[name] != getattr(dtypes, vals[name].dtype):
        mism.append(Mismatch(name, f"dtype {run.dtypes[name]}, expected {vals[name].dtype}"))
    if run.error is not None or mism:
      _last_failed_kind[device] = setting.kind
      msg = reproducer(program, device, setting, run, want, mism, backend)
      # a RecursionError's own traceback is thousands of frames: the reproducer's summary of it is what helps
      cause = None if isinstance(run.error, RecursionError) else run.error
      raise AssertionError("program fuzz found a difference; reproducer:\n" + msg) from cause
  return want


def draw_program(seed: str, max_ops: int = 10, max_size: int = 128) -> Program:
  """The program `programs(max_ops, max_size)` draws from the random stream seeded by `seed`: the same seed gives the same
  program in every process (hypothesis' `.example()` draws from a stream of its own, which no seed reaches)."""
  from hypothesis.errors import StopTest
  from hypothesis.internal.conjecture.data import ConjectureData
  rng = random.Random(seed)
  strategy = programs(max_ops=max_ops, max_size=max_size)
  for _ in range(100):
    try:
      return ConjectureData(random=rng).draw(strategy)
    except (StopTest, Exception):  # noqa: BLE001  a draw the strategy rejected (a filter, an overrun): draw again
      continue
  raise RuntimeError(f"no program could be drawn from seed {seed!r}")


def fuzz_for(device: str, seconds: float, max_failures: int = 1, seed: Optional[int] = None,
             on_failure: Optional[Callable[[int, str], None]] = None, only: Optional[int] = None) -> Tuple[int, List[str]]:
  """Check freshly drawn programs on device for `seconds` (the default settings plus one random opt list each).

  Program i (from 0) and its random opts come from the seed string f"{seed}:{i}", so `only=i` with the same seed checks
  that one program again. Each failure is passed to on_failure(i, reproducer) as soon as it is found. Returns (programs
  checked, the reproducers of the failures). Stops at max_failures: on a GPU the first fault can leave the context
  unusable, and everything after it would fail for that reason alone."""
  import warnings
  if seed is None:
    seed = random.randrange(2**31)
  failures: List[str] = []
  checked, start = 0, time.perf_counter()
  indices = itertools.count() if only is None else iter([only])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for i in indices:
      if (only is None and time.perf_counter() - start >= seconds) or len(failures) >= max_failures:
        break
      prog = draw_program(f"{seed}:{i}")
      try:
        check_program(prog, device, default_settings(random.Random(f"{seed}:{i}:opts").randrange(2**31), n_random=1))
      except AssertionError as e:
        failures.append(str(e))
        if on_failure is not None:
          on_failure(i, str(e))
      checked += 1
  return checked, failures


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m tiny.testing.program_fuzz DEVICE [--seconds S] [--max-failures N] [--seed S [--only I]]`: time-boxed
  whole-program fuzzing. The seed is printed first, and each failure (its reproducer) as soon as it is found, so a run that
  is cut short loses nothing; `--seed S --only I` checks program I of that run again."""
  import argparse
  ap = argparse.ArgumentParser(prog="python -m tiny.testing.program_fuzz", description=main.__doc__)
  ap.add_argument("device")
  ap.add_argument("--seconds", type=float, default=60.0)
  ap.add_argument("--max-failures", type=int, default=1)
  ap.add_argument("--seed", type=int, default=None)
  ap.add_argument("--only", type=int, default=None, help="check only program number ONLY of --seed")
  args = ap.parse_args(argv)
  seed = args.seed if args.seed is not None else random.randrange(2**31)
  print(f"{args.device}: seed {seed}", flush=True)

  def report(i: int, reproducer: str) -> None:
    print(f"program {i} failed (rerun: --seed {seed} --only {i})\n{reproducer}", end="\n\n", flush=True)
  checked, failures = fuzz_for(args.device, args.seconds, args.max_failures, seed, on_failure=report, only=args.only)
  print(f"{args.device}: {checked} programs, {len(failures)} failed (seed {seed})")
  return 1 if failures else 0


if __name__ == "__main__":
  raise SystemExit(main())
