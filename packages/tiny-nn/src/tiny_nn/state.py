"""Model state: naming tensors, loading them into models, and reading/writing weight files.

File readers never trust the file: every length, offset, dtype and shape is checked against the file before it is used,
and anything wrong raises a `WeightFileError` (a `ValueError`) that says what is wrong and where.
Tensors from safetensors and torch zip/legacy files are views of the file on the DISK device (no copy until used).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import types
import zipfile
import zlib
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Tuple, Union, cast

import numpy as np

from tiny.dtype import DType, dtypes
from tiny.helpers import CI, prod, tqdm
from tiny.tensor import Tensor

__all__ = ["StateDictError", "UnsafePickleError", "WeightFileError", "get_parameters", "get_state_dict", "gguf_load", "load_state_dict",
           "safe_load", "safe_load_metadata", "safe_save", "torch_load"]

PathLike = Union[str, "os.PathLike[str]"]


class WeightFileError(ValueError):
  """A weight file is truncated, malformed or inconsistent."""


class StateDictError(ValueError):
  """A state dict does not fit the model (missing or unexpected names, wrong shapes or dtypes)."""


class UnsafePickleError(pickle.UnpicklingError, WeightFileError):
  """A pickle asked for a global that torch_load does not allow."""


# ---------------------------------------------------------------- state dicts

def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> Dict[str, Tensor]:
  """Every tensor reachable from `obj` through attributes, dicts, lists and tuples, named by its dotted path.

  >>> class Net:
  ...   def __init__(self): self.l1 = Linear(2, 3)
  >>> sorted(get_state_dict(Net()))  # ['l1.bias', 'l1.weight']
  """
  out: Dict[str, Tensor] = {}
  _collect(obj, prefix, tensor_type, out, set())
  return out


def _collect(obj: Any, prefix: str, tensor_type: type, out: Dict[str, Tensor], seen: set) -> None:
  if isinstance(obj, tensor_type):
    out[prefix.strip(".")] = cast(Tensor, obj)
    return
  if id(obj) in seen:
    return  # cycles (e.g. a layer holding its parent) would recurse forever
  if hasattr(obj, "_asdict"):  # namedtuple
    seen.add(id(obj))
    for k, v in obj._asdict().items():
      _collect(v, f"{prefix}{k}.", tensor_type, out, seen)
  elif isinstance(obj, dict):
    seen.add(id(obj))
    for k, v in obj.items():
      _collect(v, f"{prefix}{k}.", tensor_type, out, seen)
  elif isinstance(obj, (list, tuple)):
    seen.add(id(obj))
    for i, v in enumerate(obj):
      _collect(v, f"{prefix}{i}.", tensor_type, out, seen)
  elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)):
    seen.add(id(obj))
    for k, v in vars(obj).items():
      _collect(v, f"{prefix}{k}.", tensor_type, out, seen)


def get_parameters(obj: Any) -> List[Tensor]:
  """All tensors of `obj` (see `get_state_dict`), in attribute order; pass them to an optimizer."""
  return list(get_state_dict(obj).values())


def _fits(model_shape: Tuple[Any, ...], file_shape: Tuple[Any, ...]) -> bool:
  # torch stores counters like BatchNorm's num_batches_tracked as 0-d tensors where tiny_nn keeps shape (1,)
  return model_shape == file_shape or (prod(model_shape) == 1 and prod(file_shape) == 1)


def load_state_dict(model: Any, state_dict: Dict[str, Tensor], strict: bool = True, verbose: bool = True, consume: bool = False) -> None:
  """Copies the tensors of `state_dict` into the model's tensors of the same name (on the model tensor's device).

  With `strict`, a name the model has but the dict lacks, or the dict has but the model lacks, raises `StateDictError`;
  shapes and dtypes must always match. With `consume`, loaded entries are deleted from `state_dict` to free memory early.
  """
  model_sd = get_state_dict(model)
  missing = [k for k in model_sd if k not in state_dict]
  unexpected = [k for k in state_dict if k not in model_sd]
  if strict and (missing or unexpected):
    parts = []
    if missing:
      parts.append(f"missing from the state dict: {', '.join(missing[:20])}{' ...' if len(missing) > 20 else ''}")
    if unexpected:
      parts.append(f"not in the model: {', '.join(unexpected[:20])}{' ...' if len(unexpected) > 20 else ''}")
    raise StateDictError("state dict does not match the model (pass strict=False to load the common names): " + "; ".join(parts))
  problems = []
  for k, v in model_sd.items():
    if k not in state_dict:
      continue
    src = state_dict[k]
    if not isinstance(src, Tensor):
      problems.append(f"{k}: expected a Tensor, got {type(src).__name__}")
    elif not _fits(tuple(v.shape), tuple(src.shape)):
      problems.append(f"{k}: shape {tuple(src.shape)} in the state dict, {tuple(v.shape)} in the model")
    elif src.dtype != v.dtype:
      problems.append(f"{k}: dtype {src.dtype} in the state dict, {v.dtype} in the model (cast it before loading)")
  if problems:
    raise StateDictError("state dict does not fit the model: " + "; ".join(problems))
  bar = tqdm(list(model_sd.items()), disable=CI or not verbose, desc="loading state dict")
  for k, v in bar:
    if k not in state_dict:
      continue
    src = state_dict[k].detach()
    # a multi-device tensor (a tuple of devices) receives the loaded tensor sharded the way it is
    src = src.to(v.device) if isinstance(v.device, str) else src.reshape(v.shape).shard(v.device, cast(Any, v.lazydata).axis)
    if src.shape != v.shape:
      src = src.reshape(v.shape)
    v.replace(src).realize()
    if consume:
      del state_dict[k]


# ---------------------------------------------------------------- safetensors

safe_dtypes: Dict[str, DType] = {"BOOL": dtypes.bool, "I8": dtypes.int8, "U8": dtypes.uint8, "I16": dtypes.int16, "U16": dtypes.uint16,
                                 "I32": dtypes.int32, "U32": dtypes.uint32, "I64": dtypes.int64, "U64": dtypes.uint64, "F16": dtypes.float16,
                                 "BF16": dtypes.bfloat16, "F32": dtypes.float32, "F64": dtypes.float64}
inverse_safe_dtypes: Dict[DType, str] = {v: k for k, v in safe_dtypes.items()}
_MAX_SAFE_HEADER = 100_000_000  # the safetensors format caps the JSON header at 100 MB
_MAX_RANK = 64
# the most elements any loaded shape may have, zero dimensions aside: past any real tensor, inside numpy's and tiny's index range
_MAX_ELEMENTS = 1 << 40
_MAX_JSON_DIGITS = 40  # longer integers in a safetensors header cannot be sizes or offsets; they are not even converted


def _is_int(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _show(x: Any, limit: int = 100) -> str:
  """A value from a file for an error message: never fails (Python refuses to print ints over 4300 digits) and stays short."""
  if _is_int(x) and x.bit_length() > 64:
    return f"<{x.bit_length()}-bit integer>"
  if isinstance(x, (list, tuple)):
    inner = ", ".join(_show(v, limit) for v in x[:8]) + (", ..." if len(x) > 8 else "")
    r = f"[{inner}]" if isinstance(x, list) else f"({inner}{',' if len(x) == 1 else ''})"
  else:
    try:
      r = repr(x)
    except ValueError:
      r = f"<unprintable {type(x).__name__}>"
  return r if len(r) <= limit else r[:limit] + "..."


def _check_shape(shape: Any, where: str, what: str) -> Tuple[int, ...]:
  """`shape` as a tuple, after checking it holds at most _MAX_RANK non-negative ints whose product (zeros aside) is at most
  _MAX_ELEMENTS; an empty tensor with a dimension of 2**64 is as broken as a full one."""
  if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_RANK or not all(_is_int(s) and s >= 0 for s in shape):
    raise WeightFileError(f"{where}: invalid {what} {_show(shape)} (at most {_MAX_RANK} non-negative integers)")
  nonzero = 1
  for s in shape:
    nonzero *= max(s, 1)
    if nonzero > _MAX_ELEMENTS:
      raise WeightFileError(f"{where}: {what} {_show(shape)} has more than 2**40 elements")
  return tuple(shape)


class _LongInt:
  """Stands for an integer of too many digits in a safetensors header; it is no int, so no check accepts it."""

  def __init__(self, digits: int):
    self.digits = digits

  def __repr__(self) -> str:
    return f"<{self.digits}-digit integer>"


def _json_int(s: str) -> Any:
  return int(s) if len(s) <= _MAX_JSON_DIGITS else _LongInt(len(s))


def _json_object(where: str) -> Callable[[List[Tuple[str, Any]]], Dict[str, Any]]:
  def build(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
      if k in out:
        raise WeightFileError(f"{where}: safetensors header has a duplicate key {k!r}")
      out[k] = v
    return out
  return build


def _disk_tensor(fn: PathLike) -> Tensor:
  return Tensor.empty(os.stat(fn).st_size, dtype=dtypes.uint8, device=f"disk:{os.fspath(fn)}")


def _read_prefix(fn: Union[Tensor, PathLike], n: int) -> bytes:
  if isinstance(fn, Tensor):
    return bytes(fn[:n].numpy().tobytes()) if n else b""
  with open(fn, "rb") as f:
    return f.read(n)


def _size_of(fn: Union[Tensor, PathLike]) -> int:
  return cast(int, fn.shape[0]) if isinstance(fn, Tensor) else os.stat(fn).st_size


def _parse_safe_header(raw: bytes, file_size: int, where: str) -> Tuple[int, Dict[str, Any]]:
  if file_size < 8:
    raise WeightFileError(f"{where}: truncated safetensors file ({file_size} bytes, the header length alone needs 8)")
  (json_len,) = struct.unpack("<Q", raw[:8])
  if json_len > _MAX_SAFE_HEADER:
    raise WeightFileError(f"{where}: safetensors header length {json_len} is larger than the 100 MB limit")
  if 8 + json_len > file_size:
    raise WeightFileError(f"{where}: truncated safetensors file: header says {json_len} bytes of JSON but only {file_size - 8} follow")
  try:
    header = json.loads(raw[8:8 + json_len].decode("utf-8"), parse_int=_json_int, object_pairs_hook=_json_object(where))
  except WeightFileError:
    raise
  except (UnicodeDecodeError, ValueError, RecursionError) as e:
    raise WeightFileError(f"{where}: safetensors header is not valid JSON: {e}") from None
  if not isinstance(header, dict):
    raise WeightFileError(f"{where}: safetensors header must be a JSON object, got {type(header).__name__}")
  data_size = file_size - 8 - json_len
  ranges: List[Tuple[int, int, str]] = []
  for name, info in header.items():
    if name == "__metadata__":
      if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
        raise WeightFileError(f"{where}: __metadata__ must be an object of strings, got {_show(info)}")
      continue
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
      raise WeightFileError(f"{where}: entry {name!r} needs dtype, shape and data_offsets")
    dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dt, str) or dt not in safe_dtypes:
      raise WeightFileError(f"{where}: entry {name!r} has unknown dtype {_show(dt)} (known: {', '.join(safe_dtypes)})")
    _check_shape(shape, f"{where}: entry {name!r}", "shape")
    if not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs) or not 0 <= offs[0] <= offs[1]:
      raise WeightFileError(f"{where}: entry {name!r} has invalid data_offsets {_show(offs)}")
    if offs[1] > data_size:
      raise WeightFileError(f"{where}: entry {name!r} ends at byte {offs[1]} of the data section, which has only {data_size} bytes (truncated?)")
    want = prod(shape) * safe_dtypes[dt].itemsize
    if offs[1] - offs[0] != want:
      raise WeightFileError(f"{where}: entry {name!r} has {offs[1] - offs[0]} bytes but {dt}{shape} needs {want}")
    if want:
      ranges.append((offs[0], offs[1], name))
  # two tensors over the same bytes would alias each other (writing one changes the other)
  ranges.sort()
  for (_, end, a), (start, _, b) in zip(ranges, ranges[1:]):
    if start < end:
      raise WeightFileError(f"{where}: entries {a!r} and {b!r} overlap in the data section (bytes {start} to {end})")
  return json_len, header


def safe_load_metadata(fn: Union[Tensor, PathLike]) -> Tuple[Tensor, int, Dict[str, Any]]:
  """Validates a safetensors file and returns (the file as a uint8 DISK tensor, JSON header length, parsed header)."""
  where = "<tensor>" if isinstance(fn, Tensor) else os.fspath(fn)
  size = _size_of(fn)
  head = _read_prefix(fn, min(size, 8))
  json_len = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
  raw = _read_prefix(fn, min(size, 8 + json_len)) if len(head) == 8 and json_len <= _MAX_SAFE_HEADER else head
  json_len, header = _parse_safe_header(raw, size, where)
  t = fn if isinstance(fn, Tensor) else _disk_tensor(fn)
  return t, json_len, header


def _on_disk(t: Tensor) -> bool:
  return isinstance(t.device, str) and t.device.upper().startswith("DISK")


def _bytes_as(t: Tensor, start: int, nbytes: int, dtype: DType, shape: Tuple[int, ...]) -> Tensor:
  """Bytes [start, start+nbytes) of the uint8 tensor `t` reinterpreted as `dtype` with `shape` (a view when `t` is on DISK)."""
  if prod(shape) == 0:
    return Tensor.zeros(*shape, dtype=dtype)
  chunk = t[start:start + nbytes]
  # a bitcast that changes the element size exists only on DISK; other input goes through numpy
  out = (chunk if dtype == dtypes.uint8 else chunk.bitcast(dtype)) if _on_disk(t) else _np_bytes_to_tensor(chunk.numpy().tobytes(), dtype)
  return out.reshape(shape)


def _np_bytes_to_tensor(b: bytes, dtype: DType) -> Tensor:
  if dtype == dtypes.bfloat16:
    return Tensor(np.frombuffer(b, dtype=np.uint16).copy()).bitcast(dtypes.bfloat16)
  return Tensor(np.frombuffer(b, dtype=_NP_DTYPES[dtype]).copy())


_NP_DTYPES: Dict[DType, Any] = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16,
                                dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint64: np.uint64,
                                dtypes.float16: np.float16, dtypes.float32: np.float32, dtypes.float64: np.float64}


def safe_load(fn: Union[Tensor, PathLike]) -> Dict[str, Tensor]:
  """Reads a safetensors file: {name: tensor}, each a view of the file on the DISK device (move it with `.to(device)`)."""
  t, json_len, header = safe_load_metadata(fn)
  base = 8 + json_len
  return {k: _bytes_as(t, base + v["data_offsets"][0], v["data_offsets"][1] - v["data_offsets"][0], safe_dtypes[v["dtype"]], tuple(v["shape"]))
          for k, v in header.items() if k != "__metadata__"}


def _tensor_bytes(t: Tensor) -> bytes:
  t = t.detach()
  if t.dtype == dtypes.bfloat16:
    t = t.bitcast(dtypes.uint16)
  return np.ascontiguousarray(t.numpy()).tobytes()


def safe_save(tensors: Dict[str, Tensor], fn: PathLike, metadata: Optional[Dict[str, Any]] = None) -> None:
  """Writes `tensors` to a safetensors file (8-byte header length, JSON header padded to 8 bytes, raw little-endian data)."""
  headers: Dict[str, Any] = {}
  if metadata is not None:
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
      raise TypeError("safetensors metadata must be a dict of str to str")
    headers["__metadata__"] = metadata
  blobs: List[bytes] = []
  offset = 0
  for k, v in tensors.items():
    if not isinstance(k, str) or k == "__metadata__":
      raise ValueError(f"invalid tensor name {k!r}")
    if not isinstance(v, Tensor):
      raise TypeError(f"{k}: expected a Tensor, got {type(v).__name__}")
    if v.dtype not in inverse_safe_dtypes:
      raise TypeError(f"{k}: dtype {v.dtype} cannot be stored in safetensors")
    data = _tensor_bytes(v) if v.numel() else b""
    headers[k] = {"dtype": inverse_safe_dtypes[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
  j = json.dumps(headers, separators=(",", ":"))
  j += " " * ((8 - len(j) % 8) % 8)
  tmp = f"{os.fspath(fn)}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(j.encode())))
    f.write(j.encode())
    for b in blobs:
      f.write(b)
  os.replace(tmp, fn)  # never leave a half-written file under the real name


# ---------------------------------------------------------------- torch checkpoints

_torch_storages: Dict[str, DType] = {
  "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16, "BFloat16Storage": dtypes.bfloat16,
                                     "DoubleStorage": dtypes.float64, "LongStorage": dtypes.int64, "IntStorage": dtypes.int32,
                                     "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8, "ByteStorage": dtypes.uint8,
  "BoolStorage": dtypes.bool}
_torch_dtypes: Dict[str, DType] = {"float32": dtypes.float32, "float": dtypes.float32, "float16": dtypes.float16, "half": dtypes.float16,
                                   "bfloat16": dtypes.bfloat16, "float64": dtypes.float64, "double": dtypes.float64, "int64": dtypes.int64,
                                   "long": dtypes.int64, "int32": dtypes.int32, "int": dtypes.int32, "int16": dtypes.int16, "short": dtypes.int16,
                                   "int8": dtypes.int8, "uint8": dtypes.uint8, "bool": dtypes.bool}


class _Storage:
  """A torch storage named in the pickle; its bytes are located later (zip member or legacy trailer)."""

  def __init__(self, key: str, dtype: DType, numel: int):
    self.key, self.dtype, self.numel = key, dtype, numel
    self.tensor: Optional[Tensor] = None  # 1-d tensor of numel elements, set once the file offsets are known


class _Pending:
  """A tensor the pickle asked to rebuild: storage + offset + size + stride, checked and materialized after unpickling
  (when the storage's bytes are known and the tensor's name in the checkpoint can be given)."""

  def __init__(self, where: str, storage: _Storage, offset: Any, size: Any, stride: Any):
    if not isinstance(storage, _Storage):
      raise WeightFileError(f"{where}: torch checkpoint rebuilds a tensor from a {type(storage).__name__}, not a storage")
    self.where, self.storage, self.offset, self.size, self.stride = where, storage, offset, size, stride

  def _layout(self, name: str, max_expanded_bytes: int) -> Tuple[int, Tuple[int, ...], Tuple[int, ...]]:
    where, numel, dt = f"{self.where}: tensor {name!r}", self.storage.numel, self.storage.dtype
    offset, size, stride = self.offset, self.size, self.stride
    if not isinstance(stride, (tuple, list)) or not isinstance(size, (tuple, list)) or len(size) != len(stride):
      raise WeightFileError(f"{where}: size {_show(size)} and stride {_show(stride)} must be sequences of the same length")
    size = _check_shape(size, where, "size")
    if not _is_int(offset) or offset < 0 or not all(_is_int(s) and s >= 0 for s in stride):
      raise WeightFileError(f"{where}: invalid layout: offset {_show(offset)}, stride {_show(stride)}")
    n = prod(size)
    if n == 0:
      return offset, size, tuple(stride)
    # every index the view reads must lie inside the storage's bytes, which _attach checked are in the file
    last = offset + sum((s - 1) * st for s, st in zip(size, stride))
    if last >= numel:
      raise WeightFileError(f"{where}: size {size}, stride {_show(stride)}, offset {_show(offset)} reads element {_show(last)} "
                            f"of a storage of {numel} elements")
    # zero or overlapping strides let a few stored elements stand for many: copying them out is bounded separately
    if n > numel and n * dt.itemsize > max_expanded_bytes:
      raise WeightFileError(f"{where}: a view of {n} elements repeats a storage of {numel} elements (zero or overlapping strides) and "
                            f"would need {n * dt.itemsize} bytes, over the {max_expanded_bytes}-byte limit (torch_load's max_expanded_bytes)")
    return offset, size, tuple(stride)

  def materialize(self, name: str, max_expanded_bytes: int) -> Tensor:
    offset, size, stride = self._layout(name, max_expanded_bytes)
    st, dt = self.storage.tensor, self.storage.dtype
    assert st is not None, "storage bytes not located"
    n = prod(size)
    if n == 0:
      return Tensor.zeros(*size, dtype=dt)
    if _contiguous(size, stride):
      return st[offset:offset + n].reshape(size)
    # a permuted view of a contiguous block (e.g. a saved transpose): reshape to the stored order, then permute back
    order = sorted(range(len(size)), key=lambda i: (-stride[i], i))
    if _contiguous(tuple(size[i] for i in order), tuple(stride[i] for i in order)):
      block = st[offset:offset + n].to(None)
      inverse = [order.index(i) for i in range(len(size))]
      return block.reshape(tuple(size[i] for i in order)).permute(inverse)
    # anything else (broadcast zero strides, gaps): gather it on the host
    extent = 1 + sum((s - 1) * st_ for s, st_ in zip(size, stride))
    host = st[offset:offset + extent].to(None)
    arr = _host_numpy(host)
    item = arr.itemsize
    view = np.lib.stride_tricks.as_strided(arr, shape=size, strides=tuple(s * item for s in stride))
    return _np_to_tensor(np.ascontiguousarray(view), dt)


def _host_numpy(t: Tensor) -> np.ndarray:
  return t.bitcast(dtypes.uint16).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()


def _np_to_tensor(a: np.ndarray, dt: DType) -> Tensor:
  return Tensor(a).bitcast(dtypes.bfloat16) if dt == dtypes.bfloat16 else Tensor(a)


def _contiguous(size: Tuple[int, ...], stride: Tuple[int, ...]) -> bool:
  expect = 1
  for s, st in zip(reversed(size), reversed(stride)):
    if s != 1 and st != expect:
      return False
    expect *= s
  return True


# The unpickler never hands a pickle one of tiny's own objects or any shared global: a pickle's BUILD opcode writes into
# the __dict__ of whatever it is applied to (a 100-byte file once set dtypes.float32.itemsize = 2). Each load gets fresh
# placeholders instead, and BUILD/SETITEM/APPEND are refused on anything the unpickler did not create itself.

class _TypeMarker:
  """Stands for torch.Tensor / torch.nn.Parameter where a pickle names them only as types."""

  __slots__ = ("name",)

  def __init__(self, name: str):
    self.name = name


class _StorageType:
  """Stands for torch.<X>Storage in one load."""

  __slots__ = ("name", "dtype")

  def __init__(self, name: str, dtype: DType):
    self.name, self.dtype = name, dtype


class _DTypeName:
  """Stands for torch.float32 and friends in one load."""

  __slots__ = ("name", "dtype")

  def __init__(self, name: str, dtype: DType):
    self.name, self.dtype = name, dtype


class _Callable:
  """An allowed torch function in one load; calls `fn`, which the pickle can reach only through this wrapper."""

  __slots__ = ("name", "fn")

  def __init__(self, name: str, fn: Callable[..., Any]):
    self.name, self.fn = name, fn

  def __call__(self, *args: Any) -> Any:
    return self.fn(*args)


def _rebuild_tensor(where: str, storage: Any, storage_offset: Any, size: Any, stride: Any, *_: Any) -> _Pending:
  return _Pending(where, storage, storage_offset, size, stride)


def _rebuild_tensor_v3(where: str, storage: Any, storage_offset: Any, size: Any, stride: Any, requires_grad: Any, backward_hooks: Any,
                       dtype: Any, *_: Any) -> _Pending:
  if isinstance(dtype, _DTypeName) and isinstance(storage, _Storage):
    storage.dtype = dtype.dtype
  return _Pending(where, storage, storage_offset, size, stride)


def _rebuild_parameter(data: Any, *_: Any) -> Any:
  return data


def _rebuild_from_type_v2(where: str, func: Any, new_type: Any, args: Any, state: Any) -> Any:
  if not callable(func) or not isinstance(args, tuple):
    raise WeightFileError(f"{where}: torch checkpoint has a malformed tensor rebuild call")
  return func(*args)


_MAX_PICKLE_BYTES = 64 << 20    # pickled metadata of real checkpoints is a few MB at most; the tensor data is stored apart
_MAX_EXPANDED_BYTES = 64 << 20  # zero-stride (expanded) views are copied out; a tiny file must not become gigabytes
_MAX_NESTING = 100              # state dicts nest a few levels; deeper structures only exhaust the stack
_MAX_SMALL_MEMBER = 64          # zip members like byteorder hold a word


class _RestrictedUnpickler(pickle._Unpickler):
  """Unpickles only the names a torch state dict needs; any other global (os.system, builtins.eval, ...) is refused.

  Built on the pure-Python unpickler so the opcodes that mutate objects can be checked: its memo is a dict (the C one
  grows an array to the largest index named, 512 MB for a 10-byte pickle) and it reads no more than each opcode needs.
  """

  dispatch = dict(pickle._Unpickler.dispatch)
  stack: List[Any]                    # the pure-Python unpickler's internals the opcodes below use (not in typeshed)
  pop_mark: Callable[[], List[Any]]

  def __init__(self, f: Any, where: str, storages: Dict[str, _Storage]):
    super().__init__(f)
    self.where, self.storages = where, storages
    self.fresh: Dict[int, Any] = {}  # every container this unpickler made, by id (held, so no id is reused meanwhile)
    self.allowed = self._globals()

  def _globals(self) -> Dict[Tuple[str, str], Any]:
    w = self.where
    allowed: Dict[Tuple[str, str], Any] = {
      ("torch._utils", "_rebuild_tensor"): _Callable("_rebuild_tensor", lambda *a: _rebuild_tensor(w, *a)),
      ("torch._utils", "_rebuild_tensor_v2"): _Callable("_rebuild_tensor_v2", lambda *a: _rebuild_tensor(w, *a)),
      ("torch._utils", "_rebuild_tensor_v3"): _Callable("_rebuild_tensor_v3", lambda *a: _rebuild_tensor_v3(w, *a)),
      ("torch._utils", "_rebuild_parameter"): _Callable("_rebuild_parameter", _rebuild_parameter),
      ("torch._utils", "_rebuild_parameter_with_state"): _Callable("_rebuild_parameter_with_state", _rebuild_parameter),
      ("torch._tensor", "_rebuild_from_type_v2"): _Callable("_rebuild_from_type_v2", lambda *a: _rebuild_from_type_v2(w, *a)),
      ("collections", "OrderedDict"): _Callable("OrderedDict", lambda *a: self._made(OrderedDict(*a))),
      ("torch", "Size"): _Callable("Size", tuple),
      ("torch", "Tensor"): _TypeMarker("Tensor"), ("torch.nn.parameter", "Parameter"): _TypeMarker("Parameter"),
    }
    for name, dt in _torch_storages.items():
      allowed[("torch", name)] = _StorageType(name, dt)
    for name, dt in _torch_dtypes.items():
      allowed[("torch", name)] = _DTypeName(name, dt)
    return allowed

  def _made(self, obj: Any) -> Any:
    self.fresh[id(obj)] = obj
    return obj

  def _own(self, obj: Any, op: str, kinds: Tuple[type, ...]) -> Any:
    if self.fresh.get(id(obj)) is not obj or not isinstance(obj, kinds):
      raise WeightFileError(f"{self.where}: refusing pickle opcode {op} on a {type(obj).__name__}: a checkpoint may only fill the "
                            f"{'/'.join(k.__name__ for k in kinds)} objects it creates")
    return obj

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in self.allowed:
      return self.allowed[(module, name)]
    raise UnsafePickleError(f"{self.where}: refusing to load global '{module}.{name}': torch_load only allows torch tensor and storage names "
                            "(a checkpoint that needs arbitrary code is unsafe; convert it to safetensors with torch)")

  def persistent_load(self, pid: Any) -> Any:
    if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
      raise WeightFileError(f"{self.where}: unsupported persistent id in torch checkpoint: {_show(pid)}")
    storage_type, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(key, (str, int)) or isinstance(key, bool):
      raise WeightFileError(f"{self.where}: storage key {_show(key)} is not a name")
    key = str(key)
    if not isinstance(storage_type, _StorageType):
      raise WeightFileError(f"{self.where}: storage {key} has an unknown type {_show(storage_type)}")
    if len(pid) > 5 and pid[5] is not None:
      raise WeightFileError(f"{self.where}: legacy storage views are not supported")
    if not _is_int(numel) or not 0 <= numel <= _MAX_ELEMENTS:
      raise WeightFileError(f"{self.where}: storage {key} has an invalid size {_show(numel)}")
    if key not in self.storages:
      self.storages[key] = _Storage(key, storage_type.dtype, numel)
    return self.storages[key]

  def load_setitem(self) -> None:
    value, key = self.stack.pop(), self.stack.pop()
    self._own(self.stack[-1], "SETITEM", (dict,))[key] = value

  def load_setitems(self) -> None:
    items = self.pop_mark()
    target = self._own(self.stack[-1], "SETITEMS", (dict,))
    if len(items) % 2:
      raise pickle.UnpicklingError("SETITEMS with an odd number of items")
    for i in range(0, len(items), 2):
      target[items[i]] = items[i + 1]

  def load_append(self) -> None:
    value = self.stack.pop()
    self._own(self.stack[-1], "APPEND", (list,)).append(value)

  def load_appends(self) -> None:
    items = self.pop_mark()
    self._own(self.stack[-1], "APPENDS", (list,)).extend(items)

  def load_additems(self) -> None:
    items = self.pop_mark()
    self._own(self.stack[-1], "ADDITEMS", (set,)).update(items)

  def load_build(self) -> None:
    # only torch's state-dict OrderedDicts get a BUILD (their `_metadata`), which the loaded dict does not keep
    self.stack.pop()
    self._own(self.stack[-1], "BUILD", (OrderedDict,))

  def load_refused(self) -> None:
    raise WeightFileError(f"{self.where}: torch checkpoints do not use pickle extension codes or out-of-band buffers")


def _making(op: bytes) -> Callable[[_RestrictedUnpickler], None]:
  """The opcode's own loader, then the container it pushed is recorded as made by this unpickler."""
  base = cast(Callable[[Any], None], pickle._Unpickler.dispatch[op[0]])

  def load(self: _RestrictedUnpickler) -> None:
    base(self)
    self._made(self.stack[-1])
  return load


def _install_opcodes(d: Dict[int, Callable[[Any], None]]) -> None:
  for op in (pickle.EMPTY_DICT, pickle.DICT, pickle.EMPTY_LIST, pickle.LIST, pickle.EMPTY_SET):
    d[op[0]] = _making(op)
  R = _RestrictedUnpickler
  d.update({pickle.SETITEM[0]: R.load_setitem, pickle.SETITEMS[0]: R.load_setitems, pickle.APPEND[0]: R.load_append,
            pickle.APPENDS[0]: R.load_appends, pickle.ADDITEMS[0]: R.load_additems, pickle.BUILD[0]: R.load_build})
  for op in (pickle.EXT1, pickle.EXT2, pickle.EXT4, pickle.BYTEARRAY8, pickle.NEXT_BUFFER, pickle.READONLY_BUFFER):
    d[op[0]] = R.load_refused


_install_opcodes(_RestrictedUnpickler.dispatch)


class _LimitedReader:
  """A pickle's bytes from a file: at most `limit` in all, and a length field asking for more than the file has left is
  refused before anything is read (so claiming 2 GB allocates nothing; the pure-Python unpickler would also take a short
  read as a shorter string)."""

  def __init__(self, f: Any, limit: int, left: int, where: str):
    self.f, self.budget, self.left, self.limit, self.where = f, limit, left, limit, where

  def _over(self) -> WeightFileError:
    return WeightFileError(f"{self.where}: a pickle in the checkpoint is over the {self.limit}-byte limit (torch_load's max_pickle_bytes)")

  def read(self, n: int = -1) -> bytes:
    n = self.left if n < 0 else n
    if n > self.left:
      raise WeightFileError(f"{self.where}: truncated pickle: a field needs {_show(n)} bytes but the file has {self.left} left")
    if n > self.budget:
      raise self._over()
    data = self.f.read(n)
    if len(data) != n:
      raise WeightFileError(f"{self.where}: truncated pickle: read {len(data)} of {n} bytes")
    self.left, self.budget = self.left - n, self.budget - n
    return cast(bytes, data)

  def readline(self) -> bytes:
    line = self.f.readline(min(self.left, self.budget + 1))
    self.left, self.budget = self.left - len(line), self.budget - len(line)
    if self.budget < 0:
      raise self._over()
    return cast(bytes, line)


def _unpickle(f: Any, where: str, storages: Dict[str, _Storage]) -> Any:
  try:
    return _RestrictedUnpickler(f, where, storages).load()
  except WeightFileError:
    raise
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError, struct.error, RecursionError,
          OverflowError, MemoryError) as e:
    raise WeightFileError(f"{where}: malformed torch pickle: {type(e).__name__}: {_show(str(e))}") from None


_SCALARS = (str, bytes, int, float, complex, bool, type(None))


def _child(name: str, key: Any) -> str:
  k = key if isinstance(key, str) else _show(key)
  return f"{name}.{k}" if name else k


def _materialize(obj: Any, where: str, max_expanded_bytes: int) -> Any:
  """The unpickled object with every pending tensor made a Tensor. Each object is converted once (a pickle can share
  references, and copying them at each level is exponential), and nesting is bounded."""
  memo: Dict[int, Any] = {}
  busy: set = set()  # tuples being converted: a reference cycle through one cannot be rebuilt

  def conv(o: Any, depth: int, name: str) -> Any:
    if isinstance(o, _SCALARS):
      return o
    key = id(o)
    if key in memo:
      return memo[key]
    if depth > _MAX_NESTING:
      raise WeightFileError(f"{where}: the checkpoint nests containers more than {_MAX_NESTING} deep (at {_show(name, 60)})")
    if isinstance(o, _Pending):
      out: Any = o.materialize(name, max_expanded_bytes)
    elif isinstance(o, _Storage):  # a bare storage: its elements as a 1-d tensor
      out = o.tensor
    elif isinstance(o, (_StorageType, _DTypeName)):
      out = o.dtype
    elif isinstance(o, dict):
      out = memo[key] = OrderedDict() if isinstance(o, OrderedDict) else {}
      for k, v in o.items():
        out[k] = conv(v, depth + 1, _child(name, k))
    elif isinstance(o, list):
      out = memo[key] = []
      for i, v in enumerate(o):
        out.append(conv(v, depth + 1, _child(name, i)))
    elif isinstance(o, tuple):
      if key in busy:
        raise WeightFileError(f"{where}: the checkpoint has a reference cycle through a tuple (at {_show(name, 60)})")
      busy.add(key)
      out = tuple([conv(v, depth + 1, _child(name, i)) for i, v in enumerate(o)])
      busy.discard(key)
    else:
      out = o
    memo[key] = out
    return out

  try:
    return conv(obj, 0, "")
  except RecursionError:
    raise WeightFileError(f"{where}: the checkpoint nests containers too deeply") from None


_ZIP_LOCAL_HEADER = 30
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, RuntimeError, NotImplementedError, zlib.error,
               struct.error, OverflowError)


def _zip_member_offset(fn: PathLike, info: zipfile.ZipInfo, file_size: int, where: str) -> int:
  if info.compress_type != zipfile.ZIP_STORED:
    raise WeightFileError(f"{where}: {info.filename} is compressed; torch checkpoints store data raw")
  if not 0 <= info.header_offset <= file_size - _ZIP_LOCAL_HEADER:
    raise WeightFileError(f"{where}: {info.filename} has its zip local header at byte {info.header_offset}, outside the file")
  with open(fn, "rb") as f:
    f.seek(info.header_offset)
    head = f.read(_ZIP_LOCAL_HEADER)
  if len(head) != _ZIP_LOCAL_HEADER or head[:4] != b"PK\x03\x04":
    raise WeightFileError(f"{where}: bad zip local header for {info.filename}")
  name_len, extra_len = struct.unpack("<HH", head[26:30])
  start = info.header_offset + _ZIP_LOCAL_HEADER + name_len + extra_len
  if start + info.file_size > file_size:
    raise WeightFileError(f"{where}: {info.filename} runs past the end of the file (truncated?)")
  return start


def _zip_read(zf: zipfile.ZipFile, name: str, limit: int, what: str, where: str) -> bytes:
  """A zip member's bytes, refused from its declared size before inflating anything when that is over `limit`."""
  info = zf.getinfo(name)
  if info.file_size > limit:
    raise WeightFileError(f"{where}: {name} is {info.file_size} bytes, over the {limit}-byte limit for {what}")
  try:
    with zf.open(info) as f:
      data = f.read(limit + 1)
  except _ZIP_ERRORS as e:
    raise WeightFileError(f"{where}: cannot read {name} from the zip: {type(e).__name__}: {e}") from None
  if len(data) > limit:
    raise WeightFileError(f"{where}: {name} inflates past the {limit}-byte limit for {what}")
  return data


def _attach(storage: _Storage, disk: Tensor, start: int, nbytes: int, where: str) -> None:
  need = storage.numel * storage.dtype.itemsize
  if nbytes < need:
    raise WeightFileError(f"{where}: storage {storage.key} has {nbytes} bytes but {storage.numel} x {storage.dtype} needs {need}")
  storage.tensor = _bytes_as(disk, start, need, storage.dtype, (storage.numel,)) if need else Tensor.zeros(0, dtype=storage.dtype)


def _torch_load_zip(fn: PathLike, where: str, size: int, max_pickle_bytes: int, max_expanded_bytes: int) -> Any:
  try:
    zf = zipfile.ZipFile(fn)
  except _ZIP_ERRORS as e:
    raise WeightFileError(f"{where}: not a readable torch zip checkpoint: {type(e).__name__}: {e}") from None
  with zf:
    names = zf.namelist()
    pkls = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkls) != 1:
      raise WeightFileError(f"{where}: expected one data.pkl in the torch zip checkpoint, found {len(pkls)}")
    base = pkls[0][:-len("data.pkl")]
    byteorder = f"{base}byteorder"
    if byteorder in names and _zip_read(zf, byteorder, _MAX_SMALL_MEMBER, "a byteorder record", where).strip() not in (b"little", b""):
      raise WeightFileError(f"{where}: big-endian torch checkpoints are not supported")
    pkl = _zip_read(zf, pkls[0], max_pickle_bytes, "the pickle (torch_load's max_pickle_bytes)", where)
    storages: Dict[str, _Storage] = {}
    obj = _unpickle(_LimitedReader(io.BytesIO(pkl), len(pkl), len(pkl), where), where, storages)
    disk = _disk_tensor(fn) if storages else None
    for key, s in storages.items():
      try:
        info = zf.getinfo(f"{base}data/{key}")
      except KeyError:
        raise WeightFileError(f"{where}: storage {key} is named in the pickle but {base}data/{key} is missing") from None
      assert disk is not None
      _attach(s, disk, _zip_member_offset(fn, info, size, where), info.file_size, where)
  return _materialize(obj, where, max_expanded_bytes)


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


def _torch_load_legacy(fn: PathLike, where: str, size: int, max_pickle_bytes: int, max_expanded_bytes: int) -> Any:
  storages: Dict[str, _Storage] = {}
  with open(fn, "rb") as f:
    def next_pickle(into: Dict[str, _Storage]) -> Any:
      return _unpickle(_LimitedReader(f, max_pickle_bytes, size - f.tell(), where), where, into)
    magic = next_pickle({})
    if magic != _LEGACY_MAGIC:
      raise WeightFileError(f"{where}: not a torch checkpoint (neither a zip file nor the legacy magic number)")
    if next_pickle({}) != _LEGACY_PROTOCOL:
      raise WeightFileError(f"{where}: unsupported legacy torch protocol version")
    sys_info = next_pickle({})
    if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
      raise WeightFileError(f"{where}: big-endian torch checkpoints are not supported")
    obj = next_pickle(storages)
    keys = next_pickle({})
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
      raise WeightFileError(f"{where}: malformed legacy storage key list")
    disk = _disk_tensor(fn) if keys else None
    for key in keys:
      head = f.read(8)
      if len(head) != 8:
        raise WeightFileError(f"{where}: truncated legacy checkpoint (storage {key} header missing)")
      (numel,) = struct.unpack("<q", head)
      if key not in storages:
        raise WeightFileError(f"{where}: storage {key} in the trailer is not named in the pickle")
      s = storages[key]
      if numel != s.numel:
        raise WeightFileError(f"{where}: storage {key} has {numel} elements in the trailer but {s.numel} in the pickle")
      start, nbytes = f.tell(), numel * s.dtype.itemsize
      if start + nbytes > size:
        raise WeightFileError(f"{where}: storage {key} runs past the end of the file (truncated?)")
      assert disk is not None
      _attach(s, disk, start, nbytes, where)
      f.seek(start + nbytes)
  missing = [k for k, s in storages.items() if s.tensor is None]
  if missing:
    raise WeightFileError(f"{where}: storages {missing[:5]} are named in the pickle but have no data")
  return _materialize(obj, where, max_expanded_bytes)


def torch_load(fn: PathLike, *, max_pickle_bytes: int = _MAX_PICKLE_BYTES, max_expanded_bytes: int = _MAX_EXPANDED_BYTES) -> Dict[str, Tensor]:
  """Reads a checkpoint written by `torch.save` (zip format, or the legacy format of `_use_new_zipfile_serialization=False`).

  Only the pickle globals a state dict needs are allowed (tensor rebuild functions, storage types, OrderedDict); any other
  global raises `UnsafePickleError` before it is looked up, so a hostile file cannot run code. Contiguous tensors are views
  of the file on the DISK device. A pickle over `max_pickle_bytes` is refused (checked against the zip's declared size,
  before inflating), and so is a view whose zero or overlapping strides repeat its storage into more than
  `max_expanded_bytes` (such views are copied out).
  """
  where = os.fspath(fn)
  size = os.stat(fn).st_size
  with open(fn, "rb") as f:
    magic = f.read(4)
  if len(magic) < 2:
    raise WeightFileError(f"{where}: empty or truncated torch checkpoint ({size} bytes)")
  if magic[:2] == b"PK":
    return _torch_load_zip(fn, where, size, max_pickle_bytes, max_expanded_bytes)
  if magic[:1] == b"\x80":
    return _torch_load_legacy(fn, where, size, max_pickle_bytes, max_expanded_bytes)
  raise WeightFileError(f"{where}: not a torch checkpoint (starts with {magic!r}; tar-format checkpoints from torch < 0.4 are not supported)")


# ---------------------------------------------------------------- gguf

_GGUF_SCALARS: Dict[int, Tuple[str, int]] = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
                                             7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# ggml type id -> (name, elements per block, bytes per block); the K-quants pack 256 elements into a super-block
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34),
                                               10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
                                               14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 30: ("BF16", 1, 2)}


class _Reader:
  def __init__(self, buf: Any, where: str):
    self.buf, self.pos, self.where = buf, 0, where

  def take(self, n: int, what: str) -> bytes:
    if n < 0 or self.pos + n > len(self.buf):
      raise WeightFileError(f"{self.where}: truncated GGUF file while reading {what} at byte {self.pos} (needs {n}, file has {len(self.buf)})")
    out = bytes(self.buf[self.pos:self.pos + n])
    self.pos += n
    return out

  def unpack(self, fmt: str, what: str) -> Any:
    return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

  def string(self, what: str) -> str:
    n = self.unpack("<Q", f"{what} length")
    try:
      return self.take(n, what).decode("utf-8")
    except UnicodeDecodeError:
      raise WeightFileError(f"{self.where}: {what} is not valid UTF-8") from None

  def value(self, vtype: int, what: str, depth: int = 0) -> Any:
    if vtype in _GGUF_SCALARS:
      return self.unpack(_GGUF_SCALARS[vtype][0], what)
    if vtype == _GGUF_STRING:
      return self.string(what)
    if vtype == _GGUF_ARRAY:
      if depth > 4:
        raise WeightFileError(f"{self.where}: {what} nests arrays too deeply")
      etype, count = self.unpack("<I", f"{what} element type"), self.unpack("<Q", f"{what} length")
      if count > len(self.buf) - self.pos:
        raise WeightFileError(f"{self.where}: {what} claims {count} elements, more than the file holds")
      if etype in _GGUF_SCALARS:  # numeric arrays (token scores, ids) can be long: read them in one go
        fmt, sz = _GGUF_SCALARS[etype]
        return list(struct.unpack(f"<{count}{fmt[1]}", self.take(count * sz, what)))
      return [self.value(etype, what, depth + 1) for _ in range(count)]
    raise WeightFileError(f"{self.where}: {what} has unknown GGUF value type {vtype}")


def _dequantize(raw: np.ndarray, ggml_type: int, n: int) -> np.ndarray:
  """raw uint8 bytes of `n` elements of a ggml type -> float32 (F32/F16 are reinterpreted, quantized blocks are expanded)."""
  name, block, _ = GGML_TYPES[ggml_type]
  if name == "F32":
    return raw.view(np.float32)
  if name == "F16":
    return raw.view(np.float16).astype(np.float32)
  if name == "BF16":
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
  nb = n // block
  if name == "Q8_0":
    blocks = raw.reshape(nb, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    return (d * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(-1)
  if name in ("Q4_0", "Q4_1"):
    head = 2 if name == "Q4_0" else 4
    blocks = raw.reshape(nb, head + 16)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, head:]
    # element j of a block is the low nibble of byte j for j < 16, the high nibble of byte j-16 otherwise
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    if name == "Q4_0":
      return (d * (q - 8)).reshape(-1)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * q + m).reshape(-1)
  return _dequantize_k(raw.reshape(nb, GGML_TYPES[ggml_type][2]), name).reshape(-1)


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
  """The float16 at byte `at` of every block, as a (blocks, 1) float32 column."""
  return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float32)


def _scale_min_k4(s: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
  """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins. Sub-blocks 0-3 use the low 6 bits of bytes 0-3 (scales)
  and 4-7 (mins); sub-blocks 4-7 take their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the spare
  top bits of bytes 0-3 (scales) and 4-7 (mins)."""
  sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
  mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
  return sc.astype(np.float32), mn.astype(np.float32)


def _two_bit_planes(qs: np.ndarray) -> np.ndarray:
  """Q2_K/Q3_K: 64 bytes -> 256 two-bit values. Each half of the super-block reads 32 bytes four times, shifting by 0/2/4/6."""
  return (qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3


def _dequantize_k(blocks: np.ndarray, name: str) -> np.ndarray:
  """(super-blocks, bytes) of a K-quant -> (super-blocks, 256) float32, following ggml's block layouts."""
  nb = blocks.shape[0]
  if name == "Q8_K":  # float32 d, 256 int8, 16 int16 partial sums (only used by dot products)
    return blocks[:, 0:4].copy().view(np.float32) * blocks[:, 4:260].view(np.int8).astype(np.float32)
  if name in ("Q4_K", "Q5_K"):  # d, dmin, 12 bytes of scales/mins, [32 bytes of 5th bits], 128 bytes of nibbles
    sc, mn = _scale_min_k4(blocks[:, 4:16])
    ql = blocks[:, -128:].reshape(nb, 4, 1, 32)
    # each 32-byte chunk holds two sub-blocks of 32: low nibbles first, then high nibbles
    q = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(nb, 8, 32)
    if name == "Q5_K":  # bit k of qh[l] is the 5th bit of element l of sub-block k
      q = q | (((blocks[:, 16:48].reshape(nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1) << 4)
    d1, m1 = _f16(blocks, 0) * sc, _f16(blocks, 2) * mn
    return d1[:, :, None] * q.astype(np.float32) - m1[:, :, None]
  if name == "Q6_K":  # 128 bytes of low nibbles, 64 bytes of top 2 bits, 16 int8 scales, d
    ql, qh = blocks[:, 0:128].reshape(nb, 2, 1, 64), blocks[:, 128:192].reshape(nb, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(nb, 2, 4, 32)  # quarters: lo(0:32), lo(32:64), hi(0:32), hi(32:64)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).astype(np.float32).reshape(nb, 16, 16) - 32
    scale = _f16(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return (scale[:, :, None] * q).reshape(nb, 256)
  if name == "Q2_K":  # 16 bytes of (min << 4 | scale) per 16 elements, 64 bytes of 2-bit values, d, dmin
    s = blocks[:, 0:16]
    d1, m1 = _f16(blocks, 80) * (s & 0x0F).astype(np.float32), _f16(blocks, 82) * (s >> 4).astype(np.float32)
    q = _two_bit_planes(blocks[:, 16:80]).astype(np.float32).reshape(nb, 16, 16)
    return (d1[:, :, None] * q - m1[:, :, None]).reshape(nb, 256)
  if name == "Q3_K":  # 32 bytes of high-bit mask, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, d
    s = blocks[:, 96:108]
    # scale k: low 4 bits from byte k % 8 (low nibble for k < 8, high nibble after), top 2 bits from byte 8 + k % 4
    lo = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)
    hi = (np.tile(s[:, 8:12], 4) >> np.repeat(2 * np.arange(4, dtype=np.uint8), 4)) & 3
    scale = _f16(blocks, 108) * ((lo | (hi << 4)).astype(np.float32) - 32)
    # a clear bit in the mask subtracts 4; bit n*4+j of mask byte l belongs to element l of quarter j of half n
    hbit = (blocks[:, 0:32].reshape(nb, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 2, 4, 1)) & 1
    q = (_two_bit_planes(blocks[:, 32:96]).astype(np.float32) - 4 * (1 - hbit).astype(np.float32)).reshape(nb, 16, 16)
    return (scale[:, :, None] * q).reshape(nb, 256)
  raise AssertionError(name)


def gguf_load(fn: Union[Tensor, PathLike]) -> Tuple[Dict[str, Any], Dict[str, Tensor]]:
  """Reads a GGUF (v2/v3) file: returns (key/value metadata, {name: tensor}).

  F32 tensors keep their dtype, F16 stays float16, and the quantized types (Q4_0, Q4_1, Q8_0, and the K-quants Q2_K, Q3_K,
  Q4_K, Q5_K, Q6_K, Q8_K) and BF16 are dequantized to float32.
  Shapes are in row-major order (GGUF lists dimensions fastest-first; they are reversed here).
  """
  where = "<tensor>" if isinstance(fn, Tensor) else os.fspath(fn)
  if isinstance(fn, Tensor):
    buf: Any = fn.numpy().reshape(-1).view(np.uint8)
  else:
    if os.stat(fn).st_size == 0:
      raise WeightFileError(f"{where}: empty GGUF file")
    buf = np.memmap(fn, dtype=np.uint8, mode="r")
  r = _Reader(buf, where)
  if r.take(4, "magic") != b"GGUF":
    raise WeightFileError(f"{where}: not a GGUF file (bad magic)")
  version = r.unpack("<I", "version")
  if version not in (2, 3):
    raise WeightFileError(f"{where}: unsupported GGUF version {version} (2 and 3 are supported)")
  n_tensors, n_kv = r.unpack("<Q", "tensor count"), r.unpack("<Q", "metadata count")
  if n_tensors > len(buf) or n_kv > len(buf):
    raise WeightFileError(f"{where}: GGUF counts ({n_tensors} tensors, {n_kv} keys) exceed the file size")
  kv: Dict[str, Any] = {}
  for i in range(n_kv):
    key = r.string(f"metadata key {i}")
    if key in kv:
      raise WeightFileError(f"{where}: duplicate metadata key {key!r}")
    kv[key] = r.value(r.unpack("<I", f"type of {key}"), f"value of {key}")
  infos = []
  names = set()
  for i in range(n_tensors):
    name = r.string(f"tensor name {i}")
    if name in names:
      raise WeightFileError(f"{where}: duplicate tensor name {name!r}")
    names.add(name)
    n_dims = r.unpack("<I", f"rank of {name}")
    if n_dims > 8:
      raise WeightFileError(f"{where}: tensor {name!r} has rank {n_dims}")
    dims = list(_check_shape([r.unpack("<Q", f"dims of {name}") for _ in range(n_dims)], f"{where}: tensor {name!r}", "dims"))
    ggml_type, offset = r.unpack("<I", f"type of {name}"), r.unpack("<Q", f"offset of {name}")
    if ggml_type not in GGML_TYPES:
      known = ", ".join(v[0] for v in GGML_TYPES.values())
      raise WeightFileError(f"{where}: tensor {name!r} has unsupported ggml type {ggml_type} (supported: {known})")
    infos.append((name, dims, ggml_type, offset))
  alignment = kv.get("general.alignment", 32)
  if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
    raise WeightFileError(f"{where}: general.alignment must be a positive power of two, got {alignment!r}")
  data_start = (r.pos + alignment - 1) // alignment * alignment
  tensors: Dict[str, Tensor] = {}
  for name, dims, ggml_type, offset in infos:
    tname, block, block_bytes = GGML_TYPES[ggml_type]
    n = prod(dims)
    first = dims[0] if dims else 1  # a scalar is one element: no quantized block
    if first % block:
      raise WeightFileError(f"{where}: tensor {name!r}: {tname} needs the first dimension ({first}) to be a multiple of {block}")
    nbytes = n // block * block_bytes
    start = data_start + offset
    if start + nbytes > len(buf):
      raise WeightFileError(f"{where}: tensor {name!r} ({tname}, {nbytes} bytes at {start}) runs past the end of the file ({len(buf)} bytes)")
    shape = tuple(reversed(dims))
    vals = _dequantize(np.asarray(buf[start:start + nbytes]), ggml_type, n)
    tensors[name] = Tensor(np.array(vals.reshape(shape) if shape else vals.reshape(()), dtype=np.float16 if tname == "F16" else np.float32))
  return kv, tensors

