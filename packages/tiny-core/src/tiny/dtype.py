"""Data types: scalar and vector `DType`s, pointers, images, and the type-promotion lattice."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Final, Optional, Set, Tuple, Union

from tiny.helpers import getenv

ConstType = Union[float, int, bool]


@dataclass(frozen=True, order=True)
class DType:
  """A scalar (count == 1) or vector element type. `priority` orders types for promotion; `fmt` is the struct/numpy code."""

  priority: int
  itemsize: int
  name: str
  fmt: Optional[str]
  count: int

  # codegen compares and hashes dtypes a few hundred thousand times per model: identity first, the hash computed once
  # (str hashes are salted per process, so it stays out of pickles), instead of the dataclass methods that build a tuple
  # of the fields on every call. Subclasses keep their generated methods.
  def __eq__(self, other: object) -> bool:
    if self is other:
      return True
    if other.__class__ is not self.__class__:
      return NotImplemented
    o: DType = other  # type: ignore[assignment]
    return self.priority == o.priority and self.itemsize == o.itemsize and self.name == o.name and self.count == o.count and \
      self.fmt == o.fmt

  def __hash__(self) -> int:
    if (ret := self.__dict__.get("_hash")) is None:
      ret = self.__dict__["_hash"] = hash((self.priority, self.itemsize, self.name, self.fmt, self.count))
    return ret

  def __getstate__(self) -> Dict[str, Any]:
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}

  def __repr__(self) -> str:
    if self.count == 1:
      return f"dtypes.{INVERSE_DTYPES_DICT[self.name]}"
    return f"dtypes._{INVERSE_DTYPES_DICT[self.scalar().name]}{self.count}"

  def vec(self, sz: int) -> DType:
    """The vector type of sz elements of this scalar type."""
    if sz <= 1 or self.count != 1:
      raise ValueError(f"can't vectorize {self} with size {sz}")
    return DType(self.priority, self.itemsize * sz, f"{INVERSE_DTYPES_DICT[self.name]}{sz}", None, sz)

  def scalar(self) -> DType:
    """The element type of a vector type (self for scalars)."""
    return DTYPES_DICT[self.name[:-len(str(self.count))]] if self.count > 1 else self


@dataclass(frozen=True, repr=False)
class ImageDType(DType):
  """A texture type (used by image kernels): `shape` is the image shape, `base` the element type."""

  shape: Tuple[int, ...]
  base: DType

  def scalar(self) -> DType:
    return self.base

  def vec(self, sz: int) -> DType:
    return self.base.vec(sz)

  def __repr__(self) -> str:
    return f"dtypes.{self.name}({self.shape})"


@dataclass(frozen=True, init=False, repr=False)
class PtrDType(DType):
  """A pointer to a buffer of `base` elements (codegen's DEFINE_GLOBAL / DEFINE_LOCAL). Equal by value, hashable."""

  base: DType
  local: bool

  def __init__(self, dt: DType, local: bool = False) -> None:
    for k, v in (("priority", dt.priority), ("itemsize", dt.itemsize), ("name", dt.name), ("fmt", dt.fmt), ("count", dt.count),
                 ("base", dt), ("local", local)):
      object.__setattr__(self, k, v)

  def scalar(self) -> DType:
    return self.base.scalar()

  def vec(self, sz: int) -> DType:
    return self.base.vec(sz)

  def __repr__(self) -> str:
    return f"ptr.{self.base!r}" + (" (local)" if self.local else "")


class dtypes:  # noqa: N801 - the public name follows tinygrad
  """Namespace of every dtype, with predicates and conversions."""

  @staticmethod
  def is_float(x: DType) -> bool:
    """True for float16, bfloat16, float32, float64 (and their vectors)."""
    return x.scalar() in _FLOATS

  @staticmethod
  def is_int(x: DType) -> bool:
    """True for signed and unsigned integer types (bool is not an int)."""
    return x.scalar() in _INTS or x == dtypes.bigint

  @staticmethod
  def is_unsigned(x: DType) -> bool:
    """True for uint8..uint64."""
    return x.scalar() in _UINTS

  @staticmethod
  def from_py(x: Any) -> DType:
    """The dtype a Python value (or nested list/tuple of values) gets by default."""
    if x.__class__ is float:
      return dtypes.default_float
    if x.__class__ is bool:
      return dtypes.bool
    if x.__class__ is int:
      return dtypes.default_int
    if isinstance(x, (list, tuple)):
      # an empty sequence is a float tensor, like torch
      return max((dtypes.from_py(xi) for xi in x), default=dtypes.default_float)
    raise TypeError(f"could not infer dtype of {x!r} ({type(x).__name__})")

  @staticmethod
  def as_const(val: Any, dtype: DType) -> Any:
    """val converted to the Python type that represents a constant of dtype (int, float or bool); symbolic values pass through."""
    if isinstance(val, tuple):
      if len(val) != dtype.count:
        raise ValueError(f"mismatch of {val} with {dtype}")
      return tuple(dtypes.as_const(x, dtype) for x in val)
    if not isinstance(val, (int, float, bool)):  # a Variable or other symbolic value
      return val
    return int(val) if dtypes.is_int(dtype) else float(val) if dtypes.is_float(dtype) else bool(val)

  @staticmethod
  def min(dtype: DType) -> ConstType:
    """Smallest value representable in dtype."""
    if dtypes.is_int(dtype):
      return 0 if dtypes.is_unsigned(dtype) else -2 ** (dtype.itemsize * 8 - 1)
    return -float("inf") if dtypes.is_float(dtype) else False

  @staticmethod
  def max(dtype: DType) -> ConstType:
    """Largest value representable in dtype."""
    if dtypes.is_int(dtype):
      return 2 ** (dtype.itemsize * 8 - (0 if dtypes.is_unsigned(dtype) else 1)) - 1
    return float("inf") if dtypes.is_float(dtype) else True

  @staticmethod
  def fields() -> Dict[str, DType]:
    """Every public dtype by name (aliases included)."""
    return DTYPES_DICT

  @staticmethod
  def from_np(x: Any) -> DType:
    """The dtype of a numpy dtype or scalar type."""
    import numpy as np
    name = np.dtype(x).name
    if name not in DTYPES_DICT:
      raise TypeError(f"numpy dtype {name} has no tiny equivalent")
    return DTYPES_DICT[name]

  @staticmethod
  def imageh(shp: Tuple[int, ...]) -> ImageDType:
    """A half-precision RGBA image of shape shp."""
    return ImageDType(100, 2, "imageh", "e", 1, shape=shp, base=dtypes.float32)

  @staticmethod
  def imagef(shp: Tuple[int, ...]) -> ImageDType:
    """A single-precision RGBA image of shape shp."""
    return ImageDType(100, 4, "imagef", "f", 1, shape=shp, base=dtypes.float32)

  bigint: Final[DType] = DType(-1, 0, "bigint", None, 1)  # arbitrary precision integer, for symbolic index math
  bool: Final[DType] = DType(0, 1, "bool", "?", 1)
  int8: Final[DType] = DType(1, 1, "char", "b", 1)
  uint8: Final[DType] = DType(2, 1, "unsigned char", "B", 1)
  int16: Final[DType] = DType(3, 2, "short", "h", 1)
  uint16: Final[DType] = DType(4, 2, "unsigned short", "H", 1)
  int32: Final[DType] = DType(5, 4, "int", "i", 1)
  uint32: Final[DType] = DType(6, 4, "unsigned int", "I", 1)
  int64: Final[DType] = DType(7, 8, "long", "l", 1)
  uint64: Final[DType] = DType(8, 8, "unsigned long", "L", 1)
  float16: Final[DType] = DType(9, 2, "half", "e", 1)
  # bfloat16 has no struct/numpy format code
  bfloat16: Final[DType] = DType(10, 2, "__bf16", None, 1)
  float32: Final[DType] = DType(11, 4, "float", "f", 1)
  float64: Final[DType] = DType(12, 8, "double", "d", 1)

  # aliases: defined after the canonical names so that INVERSE_DTYPES_DICT (and so repr) prefers them
  half = float16
  float = float32
  double = float64
  uchar = uint8
  ushort = uint16
  uint = uint32
  ulong = uint64
  char = int8
  short = int16
  int = int32
  long = int64

  default_float: ClassVar[DType] = float32
  default_int: ClassVar[DType] = int32


_FLOATS: Final[Set[DType]] = {dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
_UINTS: Final[Set[DType]] = {dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64}
_INTS: Final[Set[DType]] = _UINTS | {dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64}


def _set_default_float_from_env() -> None:
  if not (env := getenv("DEFAULT_FLOAT", "")):
    return
  dt = getattr(dtypes, env.lower(), None)
  if not isinstance(dt, DType) or not dtypes.is_float(dt):
    raise ValueError(f"DEFAULT_FLOAT={env!r} is not a float dtype; use one of HALF, BFLOAT16, FLOAT, DOUBLE, FLOAT16, FLOAT32, FLOAT64")
  dtypes.default_float = dt


_set_default_float_from_env()

# Promotion lattice (as in JAX's type promotion): an edge a -> b means a converts safely to b.
# The least upper bound of a set of dtypes is the lowest-priority dtype reachable from all of them.
promo_lattice: Dict[DType, Tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,), dtypes.int32: (dtypes.int64,),
  dtypes.int64: (dtypes.float16, dtypes.bfloat16), dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,), dtypes.float64: (),
}


@functools.lru_cache(None)
def _get_recursive_parents(dtype: DType) -> Set[DType]:
  if dtype not in promo_lattice:
    raise TypeError(f"{dtype} has no place in the promotion lattice")
  return {dtype}.union(*(_get_recursive_parents(d) for d in promo_lattice[dtype]))


def least_upper_dtype(*ds: DType) -> DType:
  """The smallest dtype every one of ds promotes to (an image dtype wins outright)."""
  if not ds:
    raise ValueError("least_upper_dtype needs at least one dtype")
  if images := [d for d in ds if isinstance(d, ImageDType)]:
    return images[0]
  return min(set.intersection(*[_get_recursive_parents(d.scalar() if not isinstance(d, PtrDType) else d.base) for d in ds]))


def least_upper_float(dt: DType) -> DType:
  """dt when it is a float, else the float it promotes to together with float32."""
  return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.float32)


def sum_acc_dtype(dt: DType) -> DType:
  """The accumulator dtype of a sum over dt: at least uint32 for unsigned, int32 for signed/bool, float32 for floats."""
  if dtypes.is_unsigned(dt):
    return least_upper_dtype(dt, dtypes.uint32)
  if dtypes.is_int(dt) or dt == dtypes.bool:
    return least_upper_dtype(dt, dtypes.int32)
  return least_upper_dtype(dt, dtypes.float32)


def to_np_dtype(dtype: DType) -> Any:
  """The numpy dtype of dtype, or None when numpy has none (bfloat16, bigint)."""
  import numpy as np
  return np.dtype(dtype.fmt) if dtype.fmt is not None else None


# every public dtype by name (aliases included); bigint and the defaults are not user dtypes
DTYPES_DICT: Dict[str, DType] = {k: v for k, v in dtypes.__dict__.items()
                                 if isinstance(v, DType) and not k.startswith(("_", "default", "bigint"))}
INVERSE_DTYPES_DICT: Dict[str, str] = {**{v.name: k for k, v in DTYPES_DICT.items()}, "bigint": "bigint"}
