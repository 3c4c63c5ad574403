"""Fuzzing the weight-file loaders with mutated valid files.

The small valid files of weight_files.SEEDS (one per format, written byte by byte) are mutated: bytes flipped or
overwritten, the file truncated, bytes inserted or deleted anywhere, and header fields edited (safetensors JSON values,
GGUF numbers, and the integers and bytes of a torch checkpoint's pickle, written back into a valid container since a
flipped byte of the zip would only fail its CRC). Loading the result must return tensors that realize (their bytes are
read from the file) or raise WeightFileError: any other exception, a crash or a blow-up fails. The default profile runs
a few dozen files; HYPOTHESIS_PROFILE=fuzz runs thousands.
"""
from __future__ import annotations

import itertools
import json
import pickletools
import struct
import time
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny.tensor import Tensor
from tiny_nn.state import WeightFileError

from .test_hostile_weights import EXT, load
from .weight_files import SEEDS, Seed, p_int, realize

_SEEDS: Dict[str, Seed] = {fmt: build() for fmt, build in SEEDS.items()}
_names = itertools.count()

_EDGES = [0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 64, 255, 256, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63,
          2**64 - 1]
numbers = st.one_of(st.sampled_from(_EDGES), st.integers(0, 300), st.integers(0, 2**64 - 1))
json_values = st.recursive(
  st.none() | st.booleans() | numbers | st.integers(-2**70, -1) | st.just(10**50) | st.floats(allow_nan=False, allow_infinity=False)
  | st.sampled_from(["F32", "F16", "BF16", "I8", "U8", "I64", "F64", "BOOL", "", "F33"]),
  lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["dtype", "shape", "data_offsets", "k"]), inner, max_size=3),
  max_leaves=8)


@st.composite
def byte_edits(draw: st.DrawFn, data: bytes) -> bytes:
  """1 to 3 of: flip or overwrite a byte, truncate, insert or delete a few bytes, anywhere."""
  for _ in range(draw(st.integers(1, 3))):
    kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
    pos = draw(st.integers(0, len(data)))
    if kind == "truncate":
      data = data[:pos]
    elif kind == "insert":
      data = data[:pos] + draw(st.binary(min_size=1, max_size=12)) + data[pos:]
    elif kind == "delete":
      data = data[:pos] + data[pos + draw(st.integers(1, 12)):]
    elif pos < len(data):
      b = data[pos] ^ draw(st.integers(1, 255)) if kind == "flip" else draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
      data = data[:pos] + bytes([b]) + data[pos + 1:]
  return data


@st.composite
def safetensors_edits(draw: st.DrawFn, data: bytes) -> bytes:
  """One JSON value of the header replaced: a whole entry, a field, or one element of a shape or data_offsets."""
  (n,) = struct.unpack("<Q", data[:8])
  header, body = json.loads(data[8:8 + n]), data[8 + n:]
  name = draw(st.sampled_from(sorted(header)))
  where = draw(st.sampled_from(["entry", "dtype", "shape", "data_offsets", "element"]))
  if name == "__metadata__" or where == "entry":
    header[name] = draw(json_values)
  elif where == "element":
    field = draw(st.sampled_from(["shape", "data_offsets"]))
    values = list(header[name][field])
    if values:
      values[draw(st.integers(0, len(values) - 1))] = draw(numbers | st.integers(-5, -1))
    else:
      values.append(draw(numbers))
    header[name] = {**header[name], field: values}
  else:
    header[name] = {**header[name], where: draw(json_values)}
  j = json.dumps(header).encode()
  return struct.pack("<Q", len(j)) + j + body


@st.composite
def gguf_edits(draw: st.DrawFn, seed: Seed) -> bytes:
  """1 to 3 header numbers (counts, lengths, value types, ranks, dims, ggml types, offsets) set to edge values."""
  data = seed.data
  for _ in range(draw(st.integers(1, 3))):
    pos, fmt = draw(st.sampled_from(seed.fields))
    fmt = fmt.upper()
    v = draw(numbers) & ((1 << (8 * struct.calcsize(fmt))) - 1)
    data = data[:pos] + struct.pack(fmt, v) + data[pos + struct.calcsize(fmt):]
  return data


def _pickle_ints(pkl: bytes) -> List[Tuple[int, int]]:
  """(position, length) of every small-int opcode in a pickle: the storage sizes, offsets, sizes and strides."""
  return [(pos, 1 + {"BININT1": 1, "BININT2": 2, "BININT": 4}[op.name]) for op, _, pos in pickletools.genops(pkl)
          if pos is not None and op.name in ("BININT1", "BININT2", "BININT")]


_INTS = {fmt: _pickle_ints(seed.pickle) for fmt, seed in _SEEDS.items() if seed.pickle}


@st.composite
def pickle_edits(draw: st.DrawFn, fmt: str) -> bytes:
  """The checkpoint rewritten around its pickle with 1 to 3 integers replaced (by any int opcode) or with byte edits."""
  seed = _SEEDS[fmt]
  assert seed.rebuild is not None
  pkl = seed.pickle
  if draw(st.booleans()):
    return seed.rebuild(draw(byte_edits(pkl)))
  for pos, n in sorted(draw(st.lists(st.sampled_from(_INTS[fmt]), min_size=1, max_size=3, unique=True)), reverse=True):
    v = draw(numbers | st.integers(-2**40, -1) | st.just(10**5000))
    pkl = pkl[:pos] + p_int(v) + pkl[pos + n:]
  return seed.rebuild(pkl)


@st.composite
def mutated_files(draw: st.DrawFn) -> Tuple[str, bytes]:
  fmt = draw(st.sampled_from(sorted(_SEEDS)))
  seed = _SEEDS[fmt]
  if draw(st.booleans()):
    if fmt == "safetensors":
      return fmt, draw(safetensors_edits(seed.data))
    if fmt == "gguf":
      return fmt, draw(gguf_edits(seed))
    return fmt, draw(pickle_edits(fmt))
  return fmt, draw(byte_edits(seed.data))


def _tensors(obj: Any) -> Iterator[Tensor]:
  """Every Tensor in a loaded structure (walked without recursion; it may be anything a mutated pickle made)."""
  todo: List[Any] = [obj]
  seen = set()
  while todo:
    o = todo.pop()
    if id(o) in seen:
      continue
    seen.add(id(o))
    if isinstance(o, Tensor):
      yield o
    elif isinstance(o, dict):
      todo.extend(o.keys())
      todo.extend(o.values())
    elif isinstance(o, (list, tuple, set, frozenset)):
      todo.extend(o)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("fuzz_weights")


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=mutated_files())
def test_mutated_file_loads_or_raises_weight_file_error(fuzz_dir, case):
  fmt, data = case
  fn = fuzz_dir / f"m{next(_names)}{EXT[fmt]}"  # a fresh name each time: a DISK device maps its file by name
  fn.write_bytes(data)
  # CPU time of this process: a blow-up shows in it, while other processes on the machine do not
  start = time.process_time()
  try:
    out = load(fmt, fn)
  except WeightFileError:
    return
  for t in _tensors(out):
    realize(t)
  assert time.process_time() - start < 20, f"{fmt}: {time.process_time() - start:.1f}s"
