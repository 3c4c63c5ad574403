"""tiny_nn.state: state dicts, safetensors, torch checkpoints and GGUF files, including hostile and broken files."""
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.tensor import Tensor

import tiny_nn
from tiny_nn.state import (StateDictError, UnsafePickleError, WeightFileError, get_parameters, get_state_dict, gguf_load, load_state_dict,
                           safe_load, safe_load_metadata, safe_save, torch_load)


def host(t: Tensor) -> np.ndarray:
  """The tensor's bytes as numpy (bfloat16 as its uint16 bit pattern)."""
  return t.bitcast(dtypes.uint16).numpy() if t.dtype == dtypes.bfloat16 else t.numpy()


# ---------------------------------------------------------------- state dicts

class Block:
  def __init__(self):
    self.conv = tiny_nn.Conv2d(1, 2, 3)
    self.norms = [tiny_nn.LayerNorm(2), tiny_nn.LayerNorm(2)]
    self.extra = {"scale": Tensor([1.0])}
    self.parent = self  # a cycle must not recurse forever
    self.name = "not a tensor"


def test_get_state_dict_names():
  sd = get_state_dict(Block())
  assert sorted(sd) == ["conv.bias", "conv.weight", "extra.scale", "norms.0.bias", "norms.0.weight", "norms.1.bias", "norms.1.weight"]
  assert len(get_parameters(Block())) == 7


def test_load_state_dict_copies_values():
  src, dst = Block(), Block()
  load_state_dict(dst, get_state_dict(src), verbose=False)
  for k, v in get_state_dict(src).items():
    np.testing.assert_array_equal(get_state_dict(dst)[k].numpy(), v.numpy())


def test_load_state_dict_errors():
  m = tiny_nn.Linear(3, 2)
  good = {"weight": Tensor.ones(2, 3), "bias": Tensor.ones(2)}
  with pytest.raises(StateDictError, match="missing from the state dict: bias"):
    load_state_dict(m, {"weight": good["weight"]}, verbose=False)
  with pytest.raises(StateDictError, match="not in the model: extra"):
    load_state_dict(m, {**good, "extra": Tensor.ones(1)}, verbose=False)
  with pytest.raises(StateDictError, match=r"weight: shape \(3, 2\)"):
    load_state_dict(m, {**good, "weight": Tensor.ones(3, 2)}, verbose=False)
  with pytest.raises(StateDictError, match="weight: dtype"):
    load_state_dict(m, {**good, "weight": Tensor.ones(2, 3, dtype=dtypes.float16)}, verbose=False)
  # non-strict loads the common names only; consume empties the dict
  sd = {"weight": Tensor.full((2, 3), 2.0), "other": Tensor.ones(1)}
  load_state_dict(m, sd, strict=False, verbose=False, consume=True)
  np.testing.assert_array_equal(m.weight.numpy(), np.full((2, 3), 2.0))
  assert list(sd) == ["other"]


# ---------------------------------------------------------------- safetensors

def sample_tensors():
  rng = np.random.RandomState(0)
  f32 = rng.randn(3, 5).astype(np.float32)
  f32[0, :3] = [np.nan, np.inf, -0.0]
  return {
    "f32": Tensor(f32), "f16": Tensor(rng.randn(4).astype(np.float16)), "f64": Tensor(rng.randn(2, 2)),
    "bf16": Tensor(rng.randint(0, 65535, size=(3,), dtype=np.uint16)).bitcast(dtypes.bfloat16),
    "i8": Tensor(rng.randint(-128, 127, (6,), dtype=np.int8)), "u8": Tensor(rng.randint(0, 255, (2, 3), dtype=np.uint8)),
    "i16": Tensor(rng.randint(-30000, 30000, (3,), dtype=np.int16)), "i32": Tensor(rng.randint(-2**31, 2**31 - 1, (4,), dtype=np.int32)),
    "i64": Tensor(np.array([-(2**62), 5, 2**62], dtype=np.int64)), "bool": Tensor(np.array([True, False, True])),
    "scalar": Tensor(np.array(3.5, dtype=np.float32)), "empty": Tensor(np.zeros((0, 4), dtype=np.float32)),
  }


def test_safetensors_roundtrip_bit_exact(tmp_path):
  fn = tmp_path / "w.safetensors"
  tensors = sample_tensors()
  safe_save(tensors, fn, metadata={"format": "pt"})
  loaded = safe_load(fn)
  assert loaded.keys() == tensors.keys()
  for k, v in tensors.items():
    assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
    assert host(loaded[k]).tobytes() == host(v).tobytes(), k
  assert safe_load_metadata(fn)[2]["__metadata__"] == {"format": "pt"}
  # the file's bytes as an in-memory tensor load the same
  from_mem = safe_load(Tensor(np.frombuffer(fn.read_bytes(), dtype=np.uint8)))
  for k, v in tensors.items():
    assert host(from_mem[k]).tobytes() == host(v).tobytes(), k


def test_safe_load_is_a_view_of_the_file(tmp_path):
  fn = tmp_path / "w.safetensors"
  safe_save({"a": Tensor([1.0, 2.0, 3.0])}, fn)
  t = safe_load(fn)["a"]
  assert str(t.device).upper().startswith("DISK")
  np.testing.assert_array_equal(t.to(None).numpy(), [1.0, 2.0, 3.0])


def write_safetensors(fn, header, data, header_len=None):
  """An independent writer: raw header bytes exactly as given."""
  j = json.dumps(header).encode() if not isinstance(header, bytes) else header
  with open(fn, "wb") as f:
    f.write(struct.pack("<Q", len(j) if header_len is None else header_len) + j + data)


def test_safe_load_reads_independently_written_file(tmp_path):
  fn = tmp_path / "x.safetensors"
  a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7, -8], dtype=np.int16)
  write_safetensors(fn, {"b": {"dtype": "I16", "shape": [2], "data_offsets": [24, 28]},
                         "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, a.tobytes() + b.tobytes())
  out = safe_load(fn)
  np.testing.assert_array_equal(out["a"].numpy(), a)
  np.testing.assert_array_equal(out["b"].numpy(), b)


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}


@pytest.mark.parametrize("header,data,header_len,match", [
  (GOOD, b"\0" * 4, None, "ends at byte 8"),                                    # truncated data
  (GOOD, b"\0" * 8, 10_000, "truncated"),                                       # header length beyond the file
  (GOOD, b"\0" * 8, 2**63, "100 MB"),                                           # absurd header length
  (b"{not json", b"", None, "not valid JSON"),
  (b"\xff\xfe", b"", None, "not valid JSON"),
  (b"[1, 2]", b"", None, "JSON object"),
  (b"[" * 100000, b"", None, "not valid JSON"),
  ({"a": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "unknown dtype"),
  ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs 12"),
  ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 800]}}, b"\0" * 8, None, "ends at byte 800"),  # lying offsets
  ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None, "invalid data_offsets"),
  ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "invalid shape"),
  ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, None, "data_offsets"),
])
def test_safe_load_rejects_malformed_files(tmp_path, header, data, header_len, match):
  fn = tmp_path / "bad.safetensors"
  write_safetensors(fn, header, data, header_len)
  with pytest.raises(WeightFileError, match=match):
    safe_load(fn)


@pytest.mark.parametrize("cut", [0, 3, 8, 20])
def test_safe_load_truncated_prefixes(tmp_path, cut):
  fn = tmp_path / "w.safetensors"
  safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([3])}, fn)
  raw = fn.read_bytes()
  fn.write_bytes(raw[:cut])
  with pytest.raises(WeightFileError):
    safe_load(fn)


def test_safe_save_rejects_bad_input(tmp_path):
  with pytest.raises(TypeError):
    safe_save({"a": np.zeros(2)}, tmp_path / "x.safetensors")
  with pytest.raises(TypeError, match="metadata"):
    safe_save({"a": Tensor([1.0])}, tmp_path / "x.safetensors", metadata={"k": 1})


# ---------------------------------------------------------------- torch checkpoints

def _torch():
  return pytest.importorskip("torch", reason="torch writes the reference checkpoints (pip install torch==2.13.0)")


def torch_state():
  torch = _torch()
  g = torch.Generator().manual_seed(0)
  base = torch.randn(4, 6, generator=g)
  return {
    "w": torch.randn(3, 5, generator=g), "half": torch.randn(7, generator=g).half(), "bf16": torch.randn(5, generator=g).bfloat16(),
    "long": torch.tensor([-(2**40), 3, 2**50]), "int": torch.tensor([1, -2], dtype=torch.int32), "byte": torch.tensor([0, 255], dtype=torch.uint8),
    "flag": torch.tensor([True, False]), "f64": torch.randn(2, generator=g, dtype=torch.float64), "scalar": torch.tensor(2.5),
    "transposed": base.t(),                     # non-contiguous permuted view
    "row": base[2],                             # offset into a shared storage
    "cols": base[:, 1:4],                       # gaps between rows
    "expanded": torch.randn(3, 1, generator=g).expand(3, 4),  # zero stride
    "param": torch.nn.Parameter(torch.ones(2)),
    "empty": torch.zeros(0, 3),
  }


@pytest.mark.parametrize("zipfmt", [True, False])
def test_torch_load_roundtrip_bit_exact(tmp_path, zipfmt):
  torch = _torch()
  fn = tmp_path / "ckpt.pt"
  ref = torch_state()
  torch.save(ref, fn, _use_new_zipfile_serialization=zipfmt)
  out = torch_load(fn)
  assert out.keys() == ref.keys()
  for k, v in ref.items():
    v = v.detach()
    expect = v.view(torch.int16).numpy() if v.dtype == torch.bfloat16 else v.numpy()
    got = host(out[k].to(None))
    assert got.shape == expect.shape, k
    assert got.dtype == expect.dtype.newbyteorder("=") or got.dtype.itemsize == expect.dtype.itemsize, k
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expect).tobytes(), k


def test_torch_load_module_state_dict_into_model(tmp_path):
  torch = _torch()
  ref = torch.nn.BatchNorm2d(3)
  with torch.no_grad():
    ref.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
    ref.running_mean.copy_(torch.tensor([0.5, -0.5, 0.25]))
  ref.num_batches_tracked += 7
  fn = tmp_path / "bn.pt"
  torch.save(ref.state_dict(), fn)
  bn = tiny_nn.BatchNorm2d(3)
  load_state_dict(bn, torch_load(fn), verbose=False)
  np.testing.assert_array_equal(bn.weight.numpy(), [1.0, 2.0, 3.0])
  np.testing.assert_array_equal(bn.running_mean.numpy(), [0.5, -0.5, 0.25])
  assert bn.num_batches_tracked.numpy().item() == 7


class Evil:
  def __init__(self, cmd):
    self.cmd = cmd

  def __reduce__(self):
    return (os.system, (self.cmd,))


def _swap_pickle(src, dst, payload):
  with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
    for info in zin.infolist():
      zout.writestr(info.filename, payload if info.filename.endswith("data.pkl") else zin.read(info.filename))


@pytest.mark.parametrize("payload_of", [
  lambda marker: pickle.dumps({"w": Evil(f"touch {marker}")}, protocol=2),
  lambda marker: pickle.dumps(Evil(f"touch {marker}")),
  lambda marker: b"cbuiltins\neval\n(V__import__('os').system('touch " + str(marker).encode() + b"')\ntR.",
  lambda marker: b"csubprocess\ncall\n((Vtouch\nV" + str(marker).encode() + b"\nltR.",
])
def test_torch_load_refuses_hostile_pickles(tmp_path, payload_of):
  torch = _torch()
  marker = tmp_path / "pwned"
  good, evil = tmp_path / "good.pt", tmp_path / "evil.pt"
  torch.save({"w": torch.ones(2)}, good)
  _swap_pickle(good, evil, payload_of(marker))
  with pytest.raises(UnsafePickleError, match="refusing to load global"):
    torch_load(evil)
  assert not marker.exists()
  # the legacy format goes through the same unpickler
  legacy = tmp_path / "evil_legacy.pt"
  legacy.write_bytes(pickle.dumps(Evil(f"touch {marker}"), protocol=2))
  with pytest.raises(UnsafePickleError):
    torch_load(legacy)
  assert not marker.exists()


@pytest.mark.parametrize("zipfmt", [True, False])
def test_torch_load_truncated_and_garbage(tmp_path, zipfmt):
  torch = _torch()
  fn = tmp_path / "ckpt.pt"
  torch.save({"w": torch.randn(64, 64)}, fn, _use_new_zipfile_serialization=zipfmt)
  raw = fn.read_bytes()
  for cut in (1, 40, len(raw) // 2, len(raw) - 100):
    fn.write_bytes(raw[:cut])
    with pytest.raises(WeightFileError):
      torch_load(fn)
  fn.write_bytes(b"this is not a checkpoint at all")
  with pytest.raises(WeightFileError, match="not a torch checkpoint"):
    torch_load(fn)


def test_torch_load_rejects_lying_storage_sizes(tmp_path):
  torch = _torch()
  good, bad = tmp_path / "good.pt", tmp_path / "bad.pt"
  torch.save({"w": torch.ones(4)}, good)
  with zipfile.ZipFile(good) as z:
    pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
  # claim a (100,) tensor on a 4-element storage
  _swap_pickle(good, bad, pkl.replace(b"K\x04\x85", b"Kd\x85", 1))
  with pytest.raises(WeightFileError):
    torch_load(bad)


# ---------------------------------------------------------------- GGUF

def gguf_string(s):
  b = s.encode()
  return struct.pack("<Q", len(b)) + b


def write_gguf(fn, kv, tensors, alignment=32, version=3):
  """A GGUF v3 writer following the spec: kv = {key: (type, value)}, tensors = [(name, dims_fastest_first, ggml_type, raw_bytes)]."""
  out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
  scal = {4: "<I", 5: "<i", 6: "<f", 10: "<Q"}
  for k, (t, v) in kv.items():
    out += gguf_string(k) + struct.pack("<I", t)
    if t == 8:
      out += gguf_string(v)
    elif t == 9:
      out += struct.pack("<IQ", 8, len(v)) + b"".join(gguf_string(x) for x in v)
    else:
      out += struct.pack(scal[t], v)
  offset, blobs = 0, []
  for name, dims, gtype, raw in tensors:
    out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, offset)
    pad = (-len(raw)) % alignment
    blobs.append(raw + b"\0" * pad)
    offset += len(raw) + pad
  out += b"\0" * ((-len(out)) % alignment)
  with open(fn, "wb") as f:
    f.write(out + b"".join(blobs))


def quant_q8_0(x):
  """ggml's reference Q8_0: per 32 values, d = max|x|/127, q = round(x/d); returns (raw bytes, dequantized values)."""
  blocks = x.reshape(-1, 32)
  d = (np.abs(blocks).max(1) / 127).astype(np.float16)
  inv = np.where(d.astype(np.float32) != 0, 1 / d.astype(np.float32), 0)
  q = np.round(blocks * inv[:, None]).clip(-127, 127).astype(np.int8)
  raw = b"".join(d[i].tobytes() + q[i].tobytes() for i in range(len(blocks)))
  return raw, (d.astype(np.float32)[:, None] * q).reshape(-1)


def quant_q4_0(x):
  """ggml's reference Q4_0: d = (signed value of largest magnitude)/-8, q = clamp(floor(x/d + 8.5), 0, 15), nibble j | nibble j+16 << 4."""
  blocks = x.reshape(-1, 32)
  idx = np.abs(blocks).argmax(1)
  d = (blocks[np.arange(len(blocks)), idx] / -8).astype(np.float16)
  inv = np.where(d.astype(np.float32) != 0, 1 / d.astype(np.float32), 0)
  q = np.minimum(15, np.floor(blocks * inv[:, None] + 8.5)).astype(np.uint8)
  packed = q[:, :16] | (q[:, 16:] << 4)
  raw = b"".join(d[i].tobytes() + packed[i].tobytes() for i in range(len(blocks)))
  return raw, (d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)).reshape(-1)


def test_gguf_load(tmp_path):
  rng = np.random.RandomState(0)
  f32 = rng.randn(3, 4).astype(np.float32)
  f16 = rng.randn(2, 5).astype(np.float16)
  xq8, xq4 = rng.randn(2, 64).astype(np.float32), rng.randn(3, 32).astype(np.float32)
  raw8, deq8 = quant_q8_0(xq8)
  raw4, deq4 = quant_q4_0(xq4)
  fn = tmp_path / "m.gguf"
  write_gguf(fn, {"general.architecture": (8, "llama"), "llama.block_count": (4, 2), "scale": (6, 0.5), "tokens": (9, ["a", "b"])},
             [("f32", [4, 3], 0, f32.tobytes()), ("f16", [5, 2], 1, f16.tobytes()), ("q8", [64, 2], 8, raw8), ("q4", [32, 3], 2, raw4)])
  kv, t = gguf_load(fn)
  assert kv == {"general.architecture": "llama", "llama.block_count": 2, "scale": 0.5, "tokens": ["a", "b"]}
  np.testing.assert_array_equal(t["f32"].numpy(), f32)
  np.testing.assert_array_equal(t["f16"].numpy(), f16)
  np.testing.assert_array_equal(t["q8"].numpy(), deq8.reshape(2, 64))
  np.testing.assert_array_equal(t["q4"].numpy(), deq4.reshape(3, 32))
  # and the dequantized values are near the originals, which checks block and nibble order independently of the packer
  assert np.abs(t["q8"].numpy() - xq8).max() < np.abs(xq8).max() / 127
  assert np.abs(t["q4"].numpy() - xq4).max() < np.abs(xq4).max() / 8 + 1e-3
  # a Tensor of the file's bytes works too
  kv2, t2 = gguf_load(Tensor(np.frombuffer(fn.read_bytes(), dtype=np.uint8)))
  np.testing.assert_array_equal(t2["q4"].numpy(), t["q4"].numpy())


def test_gguf_malformed(tmp_path):
  fn = tmp_path / "m.gguf"
  raw8, _ = quant_q8_0(np.ones(32, dtype=np.float32))
  write_gguf(fn, {"name": (8, "x")}, [("q8", [32], 8, raw8)])
  raw = fn.read_bytes()
  for cut in (0, 3, 10, 30, len(raw) - 40):  # the last 30 bytes are alignment padding
    fn.write_bytes(raw[:cut])
    with pytest.raises(WeightFileError):
      gguf_load(fn)
  fn.write_bytes(b"GGML" + raw[4:])
  with pytest.raises(WeightFileError, match="magic"):
    gguf_load(fn)
  write_gguf(fn, {}, [("t", [32], 16, b"\0" * 100)])
  with pytest.raises(WeightFileError, match="unsupported ggml type"):
    gguf_load(fn)
  write_gguf(fn, {}, [("t", [30], 8, raw8)])
  with pytest.raises(WeightFileError, match="multiple of 32"):
    gguf_load(fn)
  write_gguf(fn, {}, [("t", [1 << 20], 0, b"\0" * 64)])
  with pytest.raises(WeightFileError, match="past the end"):
    gguf_load(fn)
  write_gguf(fn, {"s": (8, "x")}, [], version=1)
  with pytest.raises(WeightFileError, match="version"):
    gguf_load(fn)
