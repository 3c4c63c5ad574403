"""Builders for valid and hostile weight files: safetensors, torch .pth (zip and legacy), GGUF.

Everything is written byte by byte here (pickle opcodes, zip records, GGUF fields) so the files do not depend on the
savers under test, and nothing binary is committed: tests call these at run time and write into tmp_path.
`CASES` is the corpus of hostile files; `SEEDS` are small valid files the fuzzer mutates.
"""
from __future__ import annotations

import json
import pickle
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tiny.dtype import dtypes
from tiny.tensor import Tensor

def realize(t: Tensor) -> np.ndarray:
  """Reads a loaded tensor's values (from the file, for lazy DISK views) into numpy; bfloat16 as its uint16 bit pattern."""
  if t.dtype == dtypes.bfloat16:
    t = t.bitcast(dtypes.uint16)
  return t.to(None).numpy()


# ---------------------------------------------------------------- pickle opcodes (protocol 2)

PROTO2 = pickle.PROTO + b"\x02"


def p_int(i: int) -> bytes:
  """The shortest pickle opcode pushing the int `i` (LONG1/LONG4 for big ones)."""
  if 0 <= i < 256:
    return pickle.BININT1 + bytes([i])
  if 0 <= i < 65536:
    return pickle.BININT2 + struct.pack("<H", i)
  if -2**31 <= i < 2**31:
    return pickle.BININT + struct.pack("<i", i)
  raw = i.to_bytes((i.bit_length() + 8) // 8, "little", signed=True)
  return (pickle.LONG1 + bytes([len(raw)]) if len(raw) < 256 else pickle.LONG4 + struct.pack("<i", len(raw))) + raw


def p_str(s: str) -> bytes:
  b = s.encode()
  return pickle.BINUNICODE + struct.pack("<I", len(b)) + b


def p_global(module: str, name: str) -> bytes:
  return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def p_tuple(*items: bytes) -> bytes:
  return pickle.MARK + b"".join(items) + pickle.TUPLE if items else pickle.EMPTY_TUPLE


def p_dict(items: Sequence[Tuple[bytes, bytes]]) -> bytes:
  """A fresh dict filled with SETITEMS (keys and values are already-encoded opcodes)."""
  body = b"".join(k + v for k, v in items)
  return pickle.EMPTY_DICT + (pickle.MARK + body + pickle.SETITEMS if items else b"")


def p_put(i: int) -> bytes:
  return pickle.BINPUT + bytes([i]) if i < 256 else pickle.LONG_BINPUT + struct.pack("<I", i)


def p_get(i: int) -> bytes:
  return pickle.BINGET + bytes([i]) if i < 256 else pickle.LONG_BINGET + struct.pack("<I", i)


@dataclass(frozen=True)
class TensorSpec:
  """A torch tensor as the pickle names it: storage key/type/element count, offset, size, stride."""

  key: str
  storage: str
  numel: int
  offset: int
  size: Tuple[int, ...]
  stride: Tuple[int, ...]


def p_tensor(t: TensorSpec, legacy: bool = False, parameter: bool = False) -> bytes:
  """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks), as torch.save writes it."""
  pid = [p_str("storage"), p_global("torch", t.storage), p_str(t.key), p_str("cpu"), p_int(t.numel)]
  if legacy:
    pid.append(pickle.NONE)  # legacy pids carry a view-metadata slot
  call = (p_global("torch._utils", "_rebuild_tensor_v2") + pickle.MARK + p_tuple(*pid) + pickle.BINPERSID + p_int(t.offset)
          + p_tuple(*map(p_int, t.size)) + p_tuple(*map(p_int, t.stride)) + pickle.NEWFALSE
          + p_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.TUPLE + pickle.REDUCE)
  if parameter:
    call = p_global("torch._utils", "_rebuild_parameter") + pickle.MARK + call + pickle.NEWFALSE + p_global("collections", "OrderedDict") \
      + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.TUPLE + pickle.REDUCE
  return call


def p_state_dict(tensors: Dict[str, TensorSpec], legacy: bool = False, metadata: bool = True) -> bytes:
  """An OrderedDict state dict like nn.Module.state_dict() pickles: SETITEMS, then BUILD with its `_metadata`."""
  body = b"".join(p_str(k) + p_tensor(t, legacy, parameter=(k == "param")) for k, t in tensors.items())
  out = PROTO2 + p_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE
  if body:
    out += pickle.MARK + body + pickle.SETITEMS
  if metadata:
    out += p_dict([(p_str("_metadata"), p_global("collections", "OrderedDict") + pickle.EMPTY_TUPLE + pickle.REDUCE)]) + pickle.BUILD
  return out + pickle.STOP


# ---------------------------------------------------------------- containers

@dataclass
class ZipMember:
  """One zip entry; the raw fields may lie (sizes, crc, offsets) on purpose."""

  name: str
  data: bytes                       # bytes as stored (already deflated when method == 8)
  method: int = 0                   # 0 stored, 8 deflate, anything else unknown
  size: Optional[int] = None        # declared uncompressed size (default: len(data) when stored)
  crc: Optional[int] = None
  flags: int = 0
  offset_shift: int = 0             # added to the central directory's local-header offset


def raw_zip(members: Sequence[ZipMember], cd_offset_shift: int = 0) -> bytes:
  """A zip archive written record by record (local headers, central directory, end record)."""
  out, central = b"", b""
  for m in members:
    size = len(m.data) if m.size is None else m.size
    crc = zlib.crc32(m.data) if m.crc is None else m.crc
    name = m.name.encode()
    fields = (20, m.flags, m.method, 0, 0x21, crc, len(m.data), size, len(name))
    local_at = len(out)
    out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", *fields, 0) + name + m.data
    central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, 0, local_at + m.offset_shift) + name
  eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(out) + cd_offset_shift, 0)
  return out + central + eocd


def pth_zip(pkl: bytes, storages: Dict[str, bytes], prefix: str = "archive") -> bytes:
  """A torch zip checkpoint: data.pkl, byteorder, version and one stored member per storage."""
  members = [ZipMember(f"{prefix}/data.pkl", pkl), ZipMember(f"{prefix}/byteorder", b"little")]
  members += [ZipMember(f"{prefix}/data/{k}", v) for k, v in storages.items()]
  return raw_zip(members + [ZipMember(f"{prefix}/version", b"3\n")])


LEGACY_MAGIC, LEGACY_PROTOCOL = 0x1950A86A20F9469CFC6C, 1001


def pth_legacy(pkl: bytes, storages: Sequence[Tuple[str, int, bytes]], keys: Optional[bytes] = None) -> bytes:
  """torch's pre-1.6 format: magic, protocol, sys_info and the object as pickles, the storage key list, then per storage
  an int64 element count followed by its raw bytes."""
  head = b"".join(pickle.dumps(x, protocol=2) for x in (LEGACY_MAGIC, LEGACY_PROTOCOL,
                                                          {"protocol_version": LEGACY_PROTOCOL, "little_endian": True,
                                                           "type_sizes": {"short": 2, "int": 4, "long": 4}}))
  keys = pickle.dumps([k for k, _, _ in storages], protocol=2) if keys is None else keys
  return head + pkl + keys + b"".join(struct.pack("<q", n) + raw for _, n, raw in storages)


def deflate_zeros(mib: int) -> Tuple[bytes, int]:
  """A raw deflate stream of `mib` MiB of zero bytes, and its CRC, made without compressing them all: a full flush
  resets the compressor, so each 1 MiB block encodes to the same bytes."""
  chunk = bytes(1 << 20)
  c = zlib.compressobj(9, zlib.DEFLATED, -15)
  block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
  crc = 0
  for _ in range(mib):
    crc = zlib.crc32(chunk, crc)
  return block * mib + c.flush(), crc


def safetensors(header: Any, data: bytes) -> bytes:
  """header: a dict (JSON-encoded here) or the raw header bytes."""
  j = header if isinstance(header, bytes) else json.dumps(header).encode()
  return struct.pack("<Q", len(j)) + j + data


def gguf_str(s: str) -> bytes:
  b = s.encode()
  return struct.pack("<Q", len(b)) + b


@dataclass
class GGUF:
  """A GGUF v3 file being written; `fields` records (byte position, struct format) of every number in the header."""

  out: bytes = b""
  fields: List[Tuple[int, str]] = field(default_factory=list)

  def num(self, fmt: str, v: int) -> None:
    self.fields.append((len(self.out), fmt))
    self.out += struct.pack(fmt, v)

  def string(self, s: str) -> None:
    self.num("<Q", len(s.encode()))
    self.out += s.encode()


def gguf(kv: Sequence[Tuple[str, int, Any]], tensors: Sequence[Tuple[str, Sequence[int], int, bytes]], alignment: int = 32) -> GGUF:
  """kv: (key, value type, value); tensors: (name, dims fastest-first, ggml type, raw bytes)."""
  g = GGUF(b"GGUF")
  g.num("<I", 3)
  g.num("<Q", len(tensors))
  g.num("<Q", len(kv))
  scalars = {4: "<I", 5: "<i", 6: "<f", 10: "<Q"}
  for key, vtype, v in kv:
    g.string(key)
    g.num("<I", vtype)
    if vtype == 8:
      g.string(v)
    elif vtype == 9:
      g.num("<I", 8)
      g.num("<Q", len(v))
      for s in v:
        g.string(s)
    elif vtype == 6:
      g.out += struct.pack("<f", v)
    else:
      g.num(scalars[vtype], v)
  offset, blobs = 0, b""
  for name, dims, gtype, raw in tensors:
    g.string(name)
    g.num("<I", len(dims))
    for d in dims:
      g.num("<Q", d)
    g.num("<I", gtype)
    g.num("<Q", offset)
    pad = (-len(raw)) % alignment
    blobs += raw + bytes(pad)
    offset += len(raw) + pad
  g.out += bytes((-len(g.out)) % alignment) + blobs
  return g


# ---------------------------------------------------------------- valid seeds

@dataclass
class Seed:
  """A small valid file and the arrays it must load as (bfloat16 as its uint16 bit pattern)."""

  fmt: str
  data: bytes
  expect: Dict[str, np.ndarray]
  fields: List[Tuple[int, str]] = field(default_factory=list)  # GGUF header numbers, for targeted edits
  pickle: bytes = b""                                            # a torch checkpoint's pickle, and how to write the file
  rebuild: Optional[Callable[[bytes], bytes]] = None             # around an edited one


def _seed_safetensors() -> Seed:
  rng = np.random.RandomState(1)
  arrays = {"w": rng.randn(2, 3).astype(np.float32), "b": np.array([-3, 0, 7, 127, -128], dtype=np.int8),
            "h": rng.randn(2).astype(np.float16), "bf": np.array([0x3F80, 0xC000, 0x7F80], dtype=np.uint16),
            "e": np.zeros((0, 3), dtype=np.float32)}
  codes = {"w": "F32", "b": "I8", "h": "F16", "bf": "BF16", "e": "F32"}
  header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
  data = b""
  for k, a in arrays.items():
    header[k] = {"dtype": codes[k], "shape": list(a.shape), "data_offsets": [len(data), len(data) + a.nbytes]}
    data += a.tobytes()
  j = json.dumps(header).encode()
  return Seed("safetensors", safetensors(j + b" " * ((-len(j)) % 8), data), arrays)


_BASE = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
_COL = np.array([1.5, -2.0, 4.0], dtype=np.float32)
_LONG = np.array([-(2**40), 3], dtype=np.int64)
_HALF = np.array([0.5, -1.0, 65504.0], dtype=np.float16)
_SEED_TENSORS = {
  "w": TensorSpec("0", "FloatStorage", 12, 0, (3, 4), (4, 1)),
  "t": TensorSpec("0", "FloatStorage", 12, 0, (4, 3), (1, 4)),     # a saved transpose
  "row": TensorSpec("0", "FloatStorage", 12, 4, (4,), (1,)),       # offset into a shared storage
  "cols": TensorSpec("0", "FloatStorage", 12, 1, (3, 2), (4, 1)),  # gaps between rows
  "e": TensorSpec("1", "FloatStorage", 3, 0, (3, 4), (1, 0)),      # expand (zero stride)
  "param": TensorSpec("2", "LongStorage", 2, 0, (2,), (1,)),
  "h": TensorSpec("3", "HalfStorage", 3, 0, (3,), (1,)),
  "s": TensorSpec("1", "FloatStorage", 3, 2, (), ()),              # 0-d
}
_SEED_STORAGES = {"0": _BASE.tobytes(), "1": _COL.tobytes(), "2": _LONG.tobytes(), "3": _HALF.tobytes()}
_SEED_EXPECT = {"w": _BASE, "t": _BASE.T, "row": _BASE[1], "cols": _BASE[:, 1:3], "e": np.repeat(_COL[:, None], 4, 1), "param": _LONG,
                "h": _HALF, "s": np.array(_COL[2])}


def _seed_pth_zip() -> Seed:
  pkl = p_state_dict(_SEED_TENSORS)
  return Seed("pth", pth_zip(pkl, _SEED_STORAGES), dict(_SEED_EXPECT), pickle=pkl, rebuild=lambda p: pth_zip(p, _SEED_STORAGES))


def _seed_pth_legacy() -> Seed:
  storages = [(k, len(v) // {"0": 4, "1": 4, "2": 8, "3": 2}[k], v) for k, v in _SEED_STORAGES.items()]
  pkl = p_state_dict(_SEED_TENSORS, legacy=True)
  return Seed("pth-legacy", pth_legacy(pkl, storages), dict(_SEED_EXPECT), pickle=pkl, rebuild=lambda p: pth_legacy(p, storages))


def _seed_gguf() -> Seed:
  rng = np.random.RandomState(2)
  f32, f16 = rng.randn(3, 4).astype(np.float32), rng.randn(5).astype(np.float16)
  # Q8_0 blocks: fp16 scale then 32 int8; Q4_0 blocks: fp16 scale then 16 bytes, element j < 16 in the low nibble of byte j
  d8, q8 = np.array([0.5, -0.25], dtype=np.float16), rng.randint(-127, 128, (2, 32)).astype(np.int8)
  raw8 = b"".join(d8[i].tobytes() + q8[i].tobytes() for i in range(2))
  d4, q4 = np.array([0.125], dtype=np.float16), rng.randint(0, 16, (1, 32)).astype(np.uint8)
  raw4 = d4.tobytes() + (q4[0, :16] | (q4[0, 16:] << 4)).tobytes()
  g = gguf([("general.architecture", 8, "tiny"), ("count", 4, 3), ("scale", 6, 0.5), ("vocab", 9, ["a", "bc"])],
           [("f32", [4, 3], 0, f32.tobytes()), ("f16", [5], 1, f16.tobytes()), ("q8", [32, 2], 8, raw8), ("q4", [32], 2, raw4)])
  expect = {"f32": f32, "f16": f16, "q8": d8.astype(np.float32)[:, None] * q8.astype(np.float32),
            "q4": (d4.astype(np.float32)[:, None] * (q4.astype(np.float32) - 8)).reshape(32)}
  return Seed("gguf", g.out, expect, fields=g.fields)


SEEDS: Dict[str, Callable[[], Seed]] = {"safetensors": _seed_safetensors, "pth": _seed_pth_zip, "pth-legacy": _seed_pth_legacy,
                                        "gguf": _seed_gguf}


# ---------------------------------------------------------------- the hostile corpus

@dataclass(frozen=True)
class Case:
  """A hostile file. Loading it must raise WeightFileError whose message names the file and matches `match` (the field
  at fault) or, for a legal file built to blow up a naive loader, load and pass `loads`; either way within the bounds."""

  name: str
  fmt: str                                     # safetensors | pth | pth-legacy | gguf
  build: Callable[[], bytes]
  match: str = ""
  loads: Optional[Callable[[Any], None]] = None
  max_seconds: float = 5.0                     # a blow-up in time fails the test
  max_peak_mib: Optional[float] = None         # a blow-up in memory fails the test (tracemalloc peak)
  kwargs: Tuple[Tuple[str, Any], ...] = ()     # loader keyword arguments


def _in_both_pth(name: str, pkl: Callable[[bool], bytes], storages: Sequence[Tuple[str, int, bytes]], match: str = "",
                 **kw: Any) -> List[Case]:
  """The same hostile pickle inside a zip checkpoint and a legacy one (pkl(legacy) builds it)."""
  return [Case(f"zip_{name}", "pth", lambda: pth_zip(pkl(False), {k: raw for k, _, raw in storages}), match, **kw),
          Case(f"legacy_{name}", "pth-legacy", lambda: pth_legacy(pkl(True), storages), match, **kw)]


def _build_on(module: str, name: str, state: bytes) -> Callable[[bool], bytes]:
  return lambda legacy: PROTO2 + p_global(module, name) + state + pickle.BUILD + pickle.STOP


_ITEMSIZE_2 = p_dict([(p_str("itemsize"), p_int(2))])


def _shared_refs(levels: int) -> bytes:
  """list_i = [list_{i-1}, list_{i-1}]: 10 bytes per level, 2**levels paths if each reference is copied."""
  out = PROTO2 + pickle.EMPTY_LIST + p_put(0)
  for i in range(1, levels + 1):
    out += pickle.EMPTY_LIST + p_put(i) + pickle.MARK + p_get(i - 1) + p_get(i - 1) + pickle.APPENDS + pickle.POP
  return out + p_get(levels) + pickle.STOP


def _one_tensor(spec: TensorSpec) -> Callable[[bool], bytes]:
  return lambda legacy: p_state_dict({"w": spec}, legacy, metadata=False)


def _expect(ok: bool, what: str) -> None:
  if not ok:
    raise AssertionError(f"expected {what}")


def _check_shared(out: Any) -> None:
  """Each level of _shared_refs must come back as one list referenced twice (converted once), 30 levels deep."""
  for _ in range(30):
    _expect(isinstance(out, list) and len(out) == 2 and out[0] is out[1], "two references to one list")
    out = out[0]
  _expect(out == [], "an empty list at the bottom")


def _pickle_cases() -> List[Case]:
  cases: List[Case] = []
  # BUILD writes into the __dict__ of whatever is on the stack: tiny's dtypes (a 100-byte file set float32.itemsize = 2)
  cases += _in_both_pth("build_on_storage_type", _build_on("torch", "FloatStorage", _ITEMSIZE_2), [], "BUILD")
  cases += _in_both_pth("build_on_torch_dtype", _build_on("torch", "float", _ITEMSIZE_2), [], "BUILD")
  cases += _in_both_pth("build_on_rebuild_function", _build_on("torch._utils", "_rebuild_tensor_v2", p_dict([(p_str("pwned"), p_int(1))])),
                        [], "BUILD")
  cases += _in_both_pth("build_slots_on_function", _build_on("torch._utils", "_rebuild_tensor_v2", p_tuple(
    pickle.NONE, p_dict([(p_str("__qualname__"), p_str("pwned"))]))), [], "BUILD")
  cases += _in_both_pth("setitem_on_global", lambda legacy: PROTO2 + p_global("torch", "FloatStorage") + p_str("k") + p_int(1)
                        + pickle.SETITEM + pickle.STOP, [], "SETITEM")
  cases += _in_both_pth("appends_on_global", lambda legacy: PROTO2 + p_global("collections", "OrderedDict") + pickle.MARK + p_int(1)
                        + pickle.APPENDS + pickle.STOP, [], "APPEND")
  # 300 bytes whose naive conversion walks 2**30 paths
  cases += _in_both_pth("shared_references", lambda legacy: _shared_refs(30), [], "", loads=_check_shared, max_seconds=2.0)
  # reference cycles: a list holding itself comes back as such; one entered through a tuple cannot be rebuilt
  cases += _in_both_pth("self_referencing_list", lambda legacy: PROTO2 + pickle.EMPTY_LIST + p_put(0) + p_get(0) + pickle.APPEND + pickle.STOP,
                        [], loads=lambda out: _expect(isinstance(out, list) and len(out) == 1 and out[0] is out, "a list holding itself"))
  cases += _in_both_pth("cycle_through_tuple", lambda legacy: PROTO2 + pickle.EMPTY_LIST + p_put(0) + p_get(0) + pickle.TUPLE1 + p_put(1)
                        + pickle.APPEND + pickle.POP + p_get(1) + pickle.STOP, [], "cycle")
  cases += _in_both_pth("nested_lists_100k", lambda legacy: PROTO2 + pickle.EMPTY_LIST * 100_000 + pickle.APPEND * 99_999 + pickle.STOP,
                        [], "nest")
  # one float expanded (stride 0) to 2**45 elements, or to 128 MiB, past the 64 MiB default for expanded views
  one = [("0", 1, struct.pack("<f", 1.0))]
  cases += _in_both_pth("stride0_huge_size", _one_tensor(TensorSpec("0", "FloatStorage", 1, 0, (2**45,), (0,))), one, "'w'.*elements")
  cases += _in_both_pth("stride0_over_cap", _one_tensor(TensorSpec("0", "FloatStorage", 1, 0, (2**25,), (0,))), one, "'w'.*elements",
                        max_peak_mib=32)
  cases += _in_both_pth("overlapping_strides_huge", _one_tensor(TensorSpec("0", "FloatStorage", 4, 0, (2**30, 2**30, 2), (0, 0, 1))),
                        [("0", 4, bytes(16))], "'w'.*elements")
  cases += _in_both_pth("size_over_2_63", _one_tensor(TensorSpec("0", "FloatStorage", 1, 0, (2**64, 0), (1, 1))), one, "'w'.*size")
  # a 5000-digit storage size (a LONG4 of 2 KB)
  cases += [Case("zip_storage_numel_5000_digits", "pth", lambda: pth_zip(_one_tensor(TensorSpec("0", "FloatStorage", 10**5000, 0, (1,), (1,)))(False),
                                                                        {"0": bytes(4)}), "storage 0"),
            Case("legacy_storage_numel_5000_digits", "pth-legacy",
                 lambda: pth_legacy(_one_tensor(TensorSpec("0", "FloatStorage", 10**5000, 0, (1,), (1,)))(True), [("0", 1, bytes(4))]), "storage 0")]
  # LONG_BINPUT 2**25: the C unpickler grows its memo array to 2**26 slots (512 MB) for a 10-byte pickle
  cases += _in_both_pth("memo_index_bomb", lambda legacy: PROTO2 + pickle.EMPTY_LIST + p_put(2**25) + pickle.STOP, [], "",
                        loads=lambda out: _expect(out == [], "an empty list"), max_peak_mib=32)
  big = p_state_dict({"w" * 5000: TensorSpec("0", "FloatStorage", 1, 0, (1,), (1,))}, metadata=False)
  cases += [Case("zip_pickle_over_cap", "pth", lambda: pth_zip(big, {"0": bytes(4)}), "data.pkl.*limit", kwargs=(("max_pickle_bytes", 4096),)),
            Case("legacy_pickle_over_cap", "pth-legacy", lambda: pth_legacy(
              p_state_dict({"w" * 5000: TensorSpec("0", "FloatStorage", 1, 0, (1,), (1,))}, legacy=True, metadata=False), [("0", 1, bytes(4))]),
              "pickle.*limit", kwargs=(("max_pickle_bytes", 4096),))]
  # BINUNICODE claiming 2 GiB: reading it must not allocate the claimed size
  cases += _in_both_pth("string_length_bomb", lambda legacy: PROTO2 + pickle.BINUNICODE + struct.pack("<I", 2**31) + b"x", [], "truncated",
                        max_peak_mib=32)
  return cases


def _bomb(name: str) -> bytes:
  """A zip whose `name` member is 200 KB of deflate that inflate to 200 MiB (with a correct size and CRC)."""
  bomb, crc = deflate_zeros(200)
  members = [] if name == "archive/data.pkl" else [ZipMember("archive/data.pkl", p_state_dict({}, metadata=False))]
  return raw_zip(members + [ZipMember(name, bomb, 8, 200 << 20, crc)])


def _zip_cases() -> List[Case]:
  ok = p_state_dict({}, metadata=False)
  return [
    # refused from the zip's declared size, before inflating
    Case("zip_deflate_bomb_data_pkl", "pth", lambda: _bomb("archive/data.pkl"), "data.pkl.*limit", max_peak_mib=32),
    Case("zip_deflate_bomb_byteorder", "pth", lambda: _bomb("archive/byteorder"), "byteorder", max_peak_mib=32),
    Case("zip_byteorder_bad_crc", "pth", lambda: raw_zip([ZipMember("archive/data.pkl", ok), ZipMember("archive/byteorder", b"little", crc=0)]),
         "byteorder"),
    Case("zip_encrypted_data_pkl", "pth", lambda: raw_zip([ZipMember("archive/data.pkl", ok, flags=1)]), "data.pkl"),
    Case("zip_unknown_compression", "pth", lambda: raw_zip([ZipMember("archive/data.pkl", ok, method=99)]), "data.pkl"),
    Case("zip_corrupt_deflate", "pth", lambda: raw_zip([ZipMember("archive/data.pkl", b"\xff" * 16, 8, 64)]), "data.pkl"),
    Case("zip_negative_member_offset", "pth", _negative_offset_zip, "data/0"),
  ]


def _negative_offset_zip() -> bytes:
  """The end record puts the central directory 10 bytes later than it is, so zipfile shifts every local-header offset
  back by 10: data.pkl's (recorded 10 too large) lands right, data/0's (recorded as 0) becomes -10."""
  pkl = _one_tensor(TensorSpec("0", "FloatStorage", 1, 0, (1,), (1,)))(False)
  return raw_zip([ZipMember("archive/data/0", bytes(4)), ZipMember("archive/data.pkl", pkl, offset_shift=10)], cd_offset_shift=10)


def _safetensors_cases() -> List[Case]:
  f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
  big = "1" + "0" * 4999
  return [
    Case("sf_dtype_unhashable", "safetensors", lambda: safetensors({"a": {**f32, "dtype": ["F32"]}}, bytes(8)), "'a'.*dtype"),
    Case("sf_dtype_dict", "safetensors", lambda: safetensors({"a": {**f32, "dtype": {"F32": 1}}}, bytes(8)), "'a'.*dtype"),
    Case("sf_shape_5000_digits", "safetensors",
         lambda: safetensors(b'{"a": {"dtype": "F32", "shape": [' + big.encode() + b'], "data_offsets": [0, 8]}}', bytes(8)), "'a'.*shape"),
    Case("sf_offsets_5000_digits", "safetensors",
         lambda: safetensors(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, ' + big.encode() + b']}}', bytes(8)), "'a'.*data_offsets"),
    Case("sf_metadata_5000_digits", "safetensors",
         lambda: safetensors(b'{"__metadata__": {"n": ' + big.encode() + b'}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
                             bytes(8)), "__metadata__"),
    Case("sf_shape_over_2_63", "safetensors", lambda: safetensors({"a": {"dtype": "F32", "shape": [2**64, 0], "data_offsets": [0, 0]}}, b""),
         "'a'.*shape"),
    Case("sf_rank_1000", "safetensors", lambda: safetensors({"a": {"dtype": "F32", "shape": [1] * 1000, "data_offsets": [0, 4]}}, bytes(4)),
         "'a'.*shape"),
    Case("sf_overlapping_ranges", "safetensors", lambda: safetensors({"a": {**f32, "data_offsets": [0, 8]}, "b": {**f32, "data_offsets": [4, 12]}},
                                                                     bytes(12)), "'a'.*'b'.*overlap|'b'.*'a'.*overlap"),
    Case("sf_same_range_twice", "safetensors", lambda: safetensors({"a": f32, "b": f32}, bytes(8)), "overlap"),
    Case("sf_duplicate_name", "safetensors",
         lambda: safetensors(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                             b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}', bytes(12)), "duplicate.*'a'"),
    Case("sf_metadata_not_strings", "safetensors", lambda: safetensors({"__metadata__": {"k": [1]}, "a": f32}, bytes(8)), "__metadata__"),
  ]


def _gguf_cases() -> List[Case]:
  f32 = struct.pack("<4f", 1, 2, 3, 4)
  q8 = struct.pack("<e", 1.0) + bytes(32)
  return [
    Case("gguf_dims_over_2_63", "gguf", lambda: gguf([], [("t", [0, 2**64 - 1], 0, b"")]).out, "'t'.*dims"),
    Case("gguf_dim_2_63", "gguf", lambda: gguf([], [("t", [2**63, 0], 0, b"")]).out, "'t'.*dims"),
    Case("gguf_duplicate_tensor_name", "gguf", lambda: gguf([], [("t", [4], 0, f32), ("t", [4], 0, f32)]).out, "duplicate.*'t'"),
    Case("gguf_duplicate_key", "gguf", lambda: gguf([("k", 4, 1), ("k", 4, 2)], []).out, "duplicate.*'k'"),
    Case("gguf_scalar_quantized", "gguf", lambda: gguf([], [("t", [], 8, q8)]).out, "'t'"),
  ]


CASES: List[Case] = _safetensors_cases() + _pickle_cases() + _zip_cases() + _gguf_cases()
