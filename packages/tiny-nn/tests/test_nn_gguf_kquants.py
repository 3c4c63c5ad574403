"""GGUF K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K) in tiny_nn.state.

Three independent pieces from the ggml block layouts: packers that put logical fields (scales, mins, quant values) into
the bytes of a super-block, an element-by-element reference decoder, and the value every element must have, computed
straight from the logical fields. The vectorized `_dequantize` and a whole `gguf_load` must agree with them exactly.
"""
import struct

import numpy as np
import pytest

from tiny.dtype import dtypes

from tiny_nn.state import GGML_TYPES, WeightFileError, _dequantize, gguf_load

F32 = np.float32
TYPE_IDS = {name: tid for tid, (name, _, _) in GGML_TYPES.items()}
BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_K": 292}


def f16_bytes(x):
  return np.float16(x).tobytes()


def i8(byte):
  return byte - 256 if byte > 127 else byte


def f16(b, at):
  return F32(np.frombuffer(bytes(b[at:at + 2]), np.float16)[0])


# ---------------------------------------------------------------- packers: logical fields -> (block bytes, expected values)

def pack_q4k_q5k(d, dmin, sc, mn, q, five_bits):
  """sc, mn: 8 six-bit values per super-block; q: 256 values of 4 (Q4_K) or 5 (Q5_K) bits."""
  s = bytearray(12)
  for j in range(4):
    s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
    s[j + 4] = (mn[j] & 63) | ((mn[j + 4] >> 4) << 6)
    s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
  qs = bytearray(128)
  for c in range(4):
    for l in range(32):
      qs[c * 32 + l] = (q[c * 64 + l] & 0xF) | ((q[c * 64 + 32 + l] & 0xF) << 4)
  qh = bytearray(32)
  for l in range(32):
    for k in range(8):
      qh[l] |= ((q[k * 32 + l] >> 4) & 1) << k
  raw = f16_bytes(d) + f16_bytes(dmin) + bytes(s) + (bytes(qh) if five_bits else b"") + bytes(qs)
  dd, dm = F32(np.float16(d)), F32(np.float16(dmin))
  want = [dd * F32(sc[e // 32]) * F32(q[e]) - dm * F32(mn[e // 32]) for e in range(256)]
  return raw, want


def pack_q6k(d, sc, q):
  """sc: 16 int8 scales; q: 256 values in [-32, 32)."""
  u = [x + 32 for x in q]
  ql, qh = bytearray(128), bytearray(64)
  for n in range(2):
    b = n * 128
    for l in range(32):
      ql[n * 64 + l] = (u[b + l] & 0xF) | ((u[b + 64 + l] & 0xF) << 4)
      ql[n * 64 + 32 + l] = (u[b + 32 + l] & 0xF) | ((u[b + 96 + l] & 0xF) << 4)
      qh[n * 32 + l] = (u[b + l] >> 4) | ((u[b + 32 + l] >> 4) << 2) | ((u[b + 64 + l] >> 4) << 4) | ((u[b + 96 + l] >> 4) << 6)
  raw = bytes(ql) + bytes(qh) + np.array(sc, np.int8).tobytes() + f16_bytes(d)
  dd = F32(np.float16(d))
  return raw, [dd * F32(sc[e // 16]) * F32(q[e]) for e in range(256)]


def pack_q8k(d, q):
  bsums = [sum(q[16 * k:16 * k + 16]) for k in range(16)]
  raw = np.float32(d).tobytes() + np.array(q, np.int8).tobytes() + np.array(bsums, np.int16).tobytes()
  return raw, [F32(d) * F32(x) for x in q]


def _pack_two_bits(u):
  qs = bytearray(64)
  for e in range(256):
    n, j, p = e // 128, (e % 128) // 32, e % 32
    qs[n * 32 + p] |= (u[e] & 3) << (2 * j)
  return qs


def pack_q2k(d, dmin, sc, mn, q):
  """sc, mn: 16 four-bit values; q: 256 two-bit values."""
  raw = bytes((sc[k] & 0xF) | (mn[k] << 4) for k in range(16)) + bytes(_pack_two_bits(q)) + f16_bytes(d) + f16_bytes(dmin)
  dd, dm = F32(np.float16(d)), F32(np.float16(dmin))
  return raw, [dd * F32(sc[e // 16]) * F32(q[e]) - dm * F32(mn[e // 16]) for e in range(256)]


def pack_q3k(d, sc, q):
  """sc: 16 scales in [-32, 32); q: 256 values in [-4, 4)."""
  u = [x + 4 for x in q]
  hmask = bytearray(32)
  for e in range(256):
    n, j, p = e // 128, (e % 128) // 32, e % 32
    hmask[p] |= (u[e] >> 2) << (n * 4 + j)
  s = bytearray(12)
  for k in range(16):
    v = sc[k] + 32
    s[k % 8] |= (v & 0xF) << (0 if k < 8 else 4)
    s[8 + k % 4] |= (v >> 4) << (2 * (k // 4))
  raw = bytes(hmask) + bytes(_pack_two_bits(u)) + bytes(s) + f16_bytes(d)
  dd = F32(np.float16(d))
  return raw, [dd * F32(sc[e // 16]) * F32(q[e]) for e in range(256)]


def random_block(name, rng):
  d, dmin = rng.uniform(-0.1, 0.1), rng.uniform(-0.1, 0.1)
  ints = lambda lo, hi, n: [int(x) for x in rng.randint(lo, hi, n)]  # noqa: E731
  if name in ("Q4_K", "Q5_K"):
    return pack_q4k_q5k(d, dmin, ints(0, 64, 8), ints(0, 64, 8), ints(0, 32 if name == "Q5_K" else 16, 256), name == "Q5_K")
  if name == "Q6_K":
    return pack_q6k(d, ints(-128, 128, 16), ints(-32, 32, 256))
  if name == "Q8_K":
    return pack_q8k(d, ints(-128, 128, 256))
  if name == "Q2_K":
    return pack_q2k(d, dmin, ints(0, 16, 16), ints(0, 16, 16), ints(0, 4, 256))
  return pack_q3k(d, ints(-32, 32, 16), ints(-4, 4, 256))


# ---------------------------------------------------------------- reference decoder, one element at a time

def scale_min_k4(j, s):
  if j < 4:
    return s[j] & 63, s[j + 4] & 63
  return (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def q3k_scale(k, s):
  low = (s[k % 8] >> (0 if k < 8 else 4)) & 0xF
  high = (s[8 + k % 4] >> (2 * (k // 4))) & 3
  return (low | (high << 4)) - 32


def ref_element(name, b, e):
  """Element e (0..255) of one super-block `b` (bytes)."""
  n, j, p = e // 128, (e % 128) // 32, e % 32  # half, quarter of the half and position, for the 2-bit layouts
  if name == "Q8_K":
    return F32(np.frombuffer(bytes(b[0:4]), np.float32)[0]) * F32(i8(b[4 + e]))
  if name in ("Q4_K", "Q5_K"):
    sub = e // 32
    sc, mn = scale_min_k4(sub, b[4:16])
    byte = b[-128:][(e // 64) * 32 + e % 32]
    q = byte & 0xF if sub % 2 == 0 else byte >> 4
    if name == "Q5_K" and (b[16 + e % 32] >> sub) & 1:
      q += 16
    return f16(b, 0) * F32(sc) * F32(q) - f16(b, 2) * F32(mn)
  if name == "Q6_K":
    quarter, l = (e % 128) // 32, e % 32
    byte = b[n * 64 + l + 32 * (quarter % 2)]
    low = byte & 0xF if quarter < 2 else byte >> 4
    high = (b[128 + n * 32 + l] >> (2 * quarter)) & 3
    return f16(b, 208) * F32(i8(b[192 + e // 16])) * F32((low | (high << 4)) - 32)
  if name == "Q2_K":
    q = (b[16 + n * 32 + p] >> (2 * j)) & 3
    s = b[e // 16]
    return f16(b, 80) * F32(s & 0xF) * F32(q) - f16(b, 82) * F32(s >> 4)
  assert name == "Q3_K"
  q = ((b[32 + n * 32 + p] >> (2 * j)) & 3) - (0 if (b[p] >> (n * 4 + j)) & 1 else 4)
  return f16(b, 108) * F32(q3k_scale(e // 16, b[96:108])) * F32(q)


def ref_decode(name, raw):
  bb = BLOCK_BYTES[name]
  return np.array([ref_element(name, raw[i:i + bb], e) for i in range(0, len(raw), bb) for e in range(256)], np.float32)


def dequant(name, raw):
  return _dequantize(np.frombuffer(raw, np.uint8), TYPE_IDS[name], len(raw) // BLOCK_BYTES[name] * 256)


KQUANTS = list(BLOCK_BYTES)


def test_type_table_matches_the_block_sizes():
  assert {name: (GGML_TYPES[TYPE_IDS[name]][1], GGML_TYPES[TYPE_IDS[name]][2]) for name in KQUANTS} == {k: (256, v) for k, v in BLOCK_BYTES.items()}
  assert TYPE_IDS == {**TYPE_IDS, "Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_K": 15}


@pytest.mark.parametrize("name", KQUANTS)
def test_packed_blocks_decode_to_their_fields(name):
  rng = np.random.RandomState(TYPE_IDS[name])
  blocks = [random_block(name, rng) for _ in range(3)]
  raw = b"".join(r for r, _ in blocks)
  assert all(len(r) == BLOCK_BYTES[name] for r, _ in blocks)
  want = np.array([x for _, w in blocks for x in w], np.float32)
  np.testing.assert_array_equal(ref_decode(name, raw), want)  # the reference decoder reads the packer's layout back
  got = dequant(name, raw)
  assert got.dtype == np.float32 and got.shape == (768,)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", KQUANTS)
def test_random_bytes_match_reference_decoder(name):
  # every bit pattern, not just what the packers produce; only the float headers are set to finite values
  rng = np.random.RandomState(100 + TYPE_IDS[name])
  raw = bytearray(rng.randint(0, 256, 4 * BLOCK_BYTES[name], dtype=np.uint8).tobytes())
  heads = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
  for i in range(4):
    base = i * BLOCK_BYTES[name]
    for at in heads.get(name, ()):
      raw[base + at:base + at + 2] = f16_bytes(rng.uniform(-2, 2))
    if name == "Q8_K":
      raw[base:base + 4] = np.float32(rng.uniform(-2, 2)).tobytes()
  np.testing.assert_array_equal(dequant(name, bytes(raw)), ref_decode(name, bytes(raw)))


# ---------------------------------------------------------------- a float quantizer: real weights survive the round trip

def quantize_q4k_q5k(x, five_bits):
  """256 floats -> one Q4_K/Q5_K block: per 32-element sub-block an affine grid, its step and offset coded in 6 bits."""
  top = 31 if five_bits else 15
  subs = x.reshape(8, 32)
  lo, step = np.minimum(subs.min(1), 0), (subs.max(1) - np.minimum(subs.min(1), 0)) / top
  d, dmin = step.max() / 63, -lo.min() / 63 if lo.min() < 0 else 0.0
  d16, dmin16 = F32(np.float16(d)), F32(np.float16(dmin))
  sc = [int(np.clip(np.round(s / d16), 1, 63)) for s in step]
  mn = [int(np.clip(np.round(-m / dmin16), 0, 63)) if dmin16 > 0 else 0 for m in lo]
  q = [int(np.clip(np.round((x[e] + dmin16 * mn[e // 32]) / (d16 * sc[e // 32])), 0, top)) for e in range(256)]
  return pack_q4k_q5k(d, dmin, sc, mn, q, five_bits)


def quantize_q6k(x):
  subs = x.reshape(16, 16)
  amax = np.abs(subs).max(1)
  d = amax.max() / 32 / 127
  d16 = F32(np.float16(d))
  sc = [int(np.clip(np.round(a / 32 / d16), 1, 127)) for a in amax]
  q = [int(np.clip(np.round(x[e] / (d16 * sc[e // 16])), -32, 31)) for e in range(256)]
  return pack_q6k(d, sc, q)


def quantize_q8k(x):
  d = np.abs(x).max() / 127
  return pack_q8k(d, [int(v) for v in np.clip(np.round(x / d), -127, 127)])


@pytest.mark.parametrize("name,quantize,bits", [("Q4_K", lambda x: quantize_q4k_q5k(x, False), 4), ("Q5_K", lambda x: quantize_q4k_q5k(x, True), 5),
                                                ("Q6_K", quantize_q6k, 6), ("Q8_K", quantize_q8k, 8)])
def test_quantized_floats_round_trip(name, quantize, bits):
  x = np.random.RandomState(bits).randn(512).astype(np.float32)
  blocks = [quantize(x[i:i + 256]) for i in range(0, 512, 256)]
  raw = b"".join(r for r, _ in blocks)
  got = dequant(name, raw)
  np.testing.assert_array_equal(got, np.array([v for _, w in blocks for v in w], np.float32))
  # the error is about half a grid step: range / 2**bits, with slack for the 6-bit coded scales
  err = np.abs(got - x).max()
  assert err < (x.max() - x.min()) / 2 ** bits, (name, err)


# ---------------------------------------------------------------- whole files

def gguf_string(s):
  b = s.encode()
  return struct.pack("<Q", len(b)) + b


def write_gguf(fn, tensors, alignment=32):
  """A GGUF v3 file with one metadata key and `tensors` = [(name, dims fastest-first, type name, raw bytes)]."""
  out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1) + gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string("llama")
  offset, data = 0, b""
  for name, dims, tname, raw in tensors:
    out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", x) for x in dims)
    out += struct.pack("<IQ", TYPE_IDS[tname], offset)
    pad = -len(raw) % alignment
    data += raw + b"\0" * pad
    offset += len(raw) + pad
  out += b"\0" * (-len(out) % alignment)
  fn.write_bytes(out + data)


def test_gguf_load_kquant_tensors(tmp_path):
  rng = np.random.RandomState(7)
  tensors, want = [], {}
  for i, name in enumerate(KQUANTS):
    rows = i % 3 + 1  # dims fastest-first: [512, rows] is a (rows, 512) tensor of 2 * rows super-blocks
    raw = b"".join(random_block(name, rng)[0] for _ in range(2 * rows))
    tensors.append((f"w.{name}", [512, rows], name, raw))
    want[f"w.{name}"] = ref_decode(name, raw).reshape(rows, 512)
  fn = tmp_path / "k.gguf"
  write_gguf(fn, tensors)
  kv, got = gguf_load(fn)
  assert kv == {"general.architecture": "llama"} and set(got) == set(want)
  for k, v in want.items():
    assert got[k].shape == v.shape and got[k].dtype == dtypes.float32
    np.testing.assert_array_equal(got[k].numpy(), v)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q2_K"])
def test_truncated_kquant_data(tmp_path, name):
  raw = b"".join(random_block(name, np.random.RandomState(1))[0] for _ in range(2))
  fn = tmp_path / "t.gguf"
  write_gguf(fn, [("w", [512], name, raw)])
  full = fn.read_bytes()
  cut = len(full) - (-len(raw) % 32) - 7  # the second super-block loses its last 7 bytes
  fn.write_bytes(full[:cut])
  with pytest.raises(WeightFileError, match=f"'w' \\({name}, {2 * BLOCK_BYTES[name]} bytes at .* runs past the end"):
    gguf_load(fn)


def test_kquant_rows_must_fill_super_blocks(tmp_path):
  fn = tmp_path / "b.gguf"
  write_gguf(fn, [("w", [128, 2], "Q4_K", bytes(144))])  # 128 elements per row: half a super-block
  with pytest.raises(WeightFileError, match="multiple of 256"):
    gguf_load(fn)
