"""dtypes: names, vectors, the promotion lattice, numpy conversion and DEFAULT_FLOAT."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given

from tiny.dtype import (DTYPES_DICT, INVERSE_DTYPES_DICT, DType, ImageDType, PtrDType, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype,
                        to_np_dtype)
from tiny.testing.strategies import scalar_dtypes

NUMPY_DTYPES = sorted((d for d in set(DTYPES_DICT.values()) if d.fmt is not None), key=lambda d: d.priority)  # stable order for xdist


def test_aliases_are_the_same_objects():
  assert dtypes.half is dtypes.float16 and dtypes.float is dtypes.float32 and dtypes.double is dtypes.float64
  assert dtypes.char is dtypes.int8 and dtypes.uchar is dtypes.uint8 and dtypes.short is dtypes.int16 and dtypes.ushort is dtypes.uint16
  assert dtypes.int is dtypes.int32 and dtypes.uint is dtypes.uint32 and dtypes.long is dtypes.int64 and dtypes.ulong is dtypes.uint64


def test_repr_names_the_dtype():
  assert repr(dtypes.float32) == "dtypes.float"
  assert repr(dtypes.int8) == "dtypes.char"
  assert repr(dtypes.bfloat16) == "dtypes.bfloat16"
  assert repr(dtypes.bool) == "dtypes.bool"
  assert repr(dtypes.float32.vec(4)) == "dtypes._float4"
  for name, dt in DTYPES_DICT.items():
    assert eval(repr(dt), {"dtypes": dtypes}) is dt, name


def test_vec_and_scalar():
  f4 = dtypes.float32.vec(4)
  assert (f4.count, f4.itemsize, f4.scalar()) == (4, 16, dtypes.float32)
  assert dtypes.uint8.vec(2).scalar() is dtypes.uint8 and dtypes.int.vec(3).itemsize == 12
  assert dtypes.is_float(f4) and not dtypes.is_int(f4)
  with pytest.raises(ValueError):
    f4.vec(2)
  with pytest.raises(ValueError):
    dtypes.float32.vec(1)


@pytest.mark.parametrize("dt", NUMPY_DTYPES, ids=str)
def test_numpy_round_trip_and_itemsize(dt):
  npdt = to_np_dtype(dt)
  assert npdt.itemsize == dt.itemsize
  assert dtypes.from_np(npdt) is dt
  assert dtypes.from_np(npdt.type) is dt


def test_bfloat16_has_no_numpy_dtype():
  assert to_np_dtype(dtypes.bfloat16) is None
  with pytest.raises(TypeError):
    dtypes.from_np(np.complex64)


def test_predicates():
  ints = {dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64}
  floats = {dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64}
  for dt in set(DTYPES_DICT.values()):
    assert dtypes.is_int(dt) == (dt in ints)
    assert dtypes.is_float(dt) == (dt in floats)
    assert dtypes.is_unsigned(dt) == (dt in ints and dt.name.startswith("unsigned"))
    if dt.fmt is not None and dt != dtypes.bool:
      npdt = to_np_dtype(dt)
      assert dtypes.is_int(dt) == np.issubdtype(npdt, np.integer) and dtypes.is_unsigned(dt) == np.issubdtype(npdt, np.unsignedinteger)


@pytest.mark.parametrize("dt", [d for d in NUMPY_DTYPES if d in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16,
                                                                dtypes.uint32, dtypes.uint64)], ids=str)
def test_int_min_max_match_numpy(dt):
  info = np.iinfo(to_np_dtype(dt))
  assert (dtypes.min(dt), dtypes.max(dt)) == (int(info.min), int(info.max))


def test_float_and_bool_min_max():
  assert dtypes.min(dtypes.float32) == -float("inf") and dtypes.max(dtypes.half) == float("inf")
  assert dtypes.min(dtypes.bool) is False and dtypes.max(dtypes.bool) is True


def test_from_py():
  assert dtypes.from_py(1) is dtypes.default_int and dtypes.from_py(1.5) is dtypes.default_float and dtypes.from_py(True) is dtypes.bool
  assert dtypes.from_py([1, 2.0]) is dtypes.default_float
  assert dtypes.from_py([True, 1]) is dtypes.default_int
  assert dtypes.from_py([[True], [False]]) is dtypes.bool
  with pytest.raises(TypeError):
    dtypes.from_py("x")


def test_as_const():
  assert dtypes.as_const(2.7, dtypes.int32) == 2 and isinstance(dtypes.as_const(2.7, dtypes.int32), int)
  assert dtypes.as_const(3, dtypes.float16) == 3.0 and isinstance(dtypes.as_const(3, dtypes.float16), float)
  assert dtypes.as_const(2, dtypes.bool) is True and dtypes.as_const(0.0, dtypes.bool) is False
  assert dtypes.as_const((1, 2.5), dtypes.int.vec(2)) == (1, 2)


# numpy's promotion agrees with tiny's lattice for bool and the integers up to 32 bits (above, tiny goes to floats like JAX)
SMALL = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32]


@pytest.mark.parametrize("a,b", list(itertools.combinations_with_replacement(SMALL, 2)), ids=str)
def test_least_upper_dtype_matches_numpy_for_small_ints(a, b):
  assert to_np_dtype(least_upper_dtype(a, b)) == np.promote_types(to_np_dtype(a), to_np_dtype(b))


def test_least_upper_dtype_lattice_cases():
  assert least_upper_dtype(dtypes.float16, dtypes.bfloat16) is dtypes.float32
  assert least_upper_dtype(dtypes.int64, dtypes.uint64) is dtypes.float16
  assert least_upper_dtype(dtypes.int32, dtypes.float16) is dtypes.float16
  assert least_upper_dtype(dtypes.bool, dtypes.float64, dtypes.int8) is dtypes.float64
  assert least_upper_dtype(dtypes.int8) is dtypes.int8
  img = dtypes.imagef((2, 2, 4))
  assert least_upper_dtype(dtypes.float32, img) is img


@given(scalar_dtypes(), scalar_dtypes(), scalar_dtypes())
def test_least_upper_dtype_is_a_commutative_upper_bound(a, b, c):
  ab = least_upper_dtype(a, b)
  assert ab == least_upper_dtype(b, a)
  assert least_upper_dtype(ab, a) == ab and least_upper_dtype(ab, b) == ab
  # not associative in general (as in tinygrad, int64/uint64 promote to both float16 and bfloat16, whose join is
  # float32), so check that the n-ary join is an upper bound of every argument instead
  abc = least_upper_dtype(a, b, c)
  assert all(least_upper_dtype(abc, x) == abc for x in (a, b, c))


def test_least_upper_float_and_sum_acc_dtype():
  assert least_upper_float(dtypes.int32) is dtypes.float32 and least_upper_float(dtypes.float16) is dtypes.float16
  assert least_upper_float(dtypes.bool) is dtypes.float32
  expected = {dtypes.bool: dtypes.int32, dtypes.int8: dtypes.int32, dtypes.uint8: dtypes.uint32, dtypes.uint16: dtypes.uint32, dtypes.int64: dtypes.int64,
              dtypes.uint64: dtypes.uint64, dtypes.float16: dtypes.float32, dtypes.bfloat16: dtypes.float32, dtypes.float64: dtypes.float64}
  for dt, acc in expected.items():
    assert sum_acc_dtype(dt) is acc, dt


def test_ptr_dtype_is_a_value():
  p = PtrDType(dtypes.float32)
  assert p == PtrDType(dtypes.float32) and hash(p) == hash(PtrDType(dtypes.float32))
  assert p != dtypes.float32 and p != PtrDType(dtypes.int32) and p != PtrDType(dtypes.float32, local=True)
  assert p.base is dtypes.float32 and p.itemsize == 4 and p.scalar() is dtypes.float32
  assert {p: 1}[PtrDType(dtypes.float32)] == 1


def test_image_dtype():
  img = dtypes.imageh((4, 4, 4))
  assert isinstance(img, ImageDType) and img.shape == (4, 4, 4) and img.base is dtypes.float32 and img.scalar() is dtypes.float32
  assert img.itemsize == 2 and dtypes.imagef((4, 4, 4)).itemsize == 4


def test_dtypes_dict():
  assert DTYPES_DICT["float"] is dtypes.float32 and "default_float" not in DTYPES_DICT and "bigint" not in DTYPES_DICT
  assert INVERSE_DTYPES_DICT["unsigned char"] == "uchar" and dtypes.fields() is DTYPES_DICT
  assert all(isinstance(v, DType) for v in DTYPES_DICT.values())


def _default_float_in_subprocess(value):
  env = {**os.environ, "DEFAULT_FLOAT": value}
  return subprocess.run([sys.executable, "-c", "from tiny.dtype import dtypes; print(repr(dtypes.default_float))"], env=env,
                        capture_output=True, text=True)


@pytest.mark.parametrize("value,expected", [("HALF", "dtypes.half"), ("bfloat16", "dtypes.bfloat16"), ("FLOAT", "dtypes.float"), ("DOUBLE", "dtypes.double")])
def test_default_float_from_env(value, expected):
  out = _default_float_in_subprocess(value)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == expected


def test_default_float_rejects_unknown_names():
  for bad in ("INT", "FLOAT7"):
    out = _default_float_in_subprocess(bad)
    assert out.returncode != 0 and "DEFAULT_FLOAT" in out.stderr and "ValueError" in out.stderr
