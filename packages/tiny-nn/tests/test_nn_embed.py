"""The all-MiniLM-L6-v2 demo against torch running the same weights (a hand-written BERT forward as the reference)."""
import json
import math
import os
import struct

import numpy as np
import pytest

from tiny.device import Device
from tiny.tensor import Tensor

SENTENCES = [
  "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "A man is riding a horse.",
  "A woman is playing violin.", "Two men pushed carts through the woods.", "A man is riding a white horse on an enclosed ground.",
  "A monkey is playing drums.", "Someone in a gorilla costume is playing a set of drums.", "The new movie is awesome.",
  "The cat sits outside.", "The new movie is so great!", "I love pasta.", "Do you like pizza?", "tiny is a small deep-learning framework",
  "Embeddings map sentences to vectors; similar meaning, nearby vectors.", "¿Dónde está la biblioteca?", "The quick brown fox jumps over the lazy dog.",
  "", "Numbers like 3.14159 and 2,718 get split into word pieces.",
]


def test_erf_matches_math():
  from tiny_nn.examples.embed import erf
  xs = np.linspace(-4, 4, 81).astype(np.float32)
  np.testing.assert_allclose(erf(Tensor(xs)).numpy(), [math.erf(x) for x in xs], atol=3e-7)


def _require_model():
  pytest.importorskip("tokenizers", reason="the embed demo tokenizes with `tokenizers` (pip install tokenizers)")
  from tiny_nn.examples.embed import model_dir
  try:
    path = model_dir()
  except ModuleNotFoundError as e:
    pytest.skip(f"model package absent: {e}")
  if not os.path.exists(os.path.join(path, "model.safetensors")):
    pytest.skip(f"no model.safetensors in {path}")
  if Device.DEFAULT == "PYTHON":
    pytest.skip("a 6-layer BERT on the PYTHON interpreter device takes minutes; install tiny-clang")
  return path


def read_safetensors_numpy(fn):
  """Independent of tiny: parse the file with json + numpy."""
  raw = open(fn, "rb").read()
  (n,) = struct.unpack("<Q", raw[:8])
  header = json.loads(raw[8:8 + n])
  out = {}
  for k, v in header.items():
    if k == "__metadata__":
      continue
    dt = {"F32": np.float32, "I64": np.int64}[v["dtype"]]
    a, b = v["data_offsets"]
    out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(v["shape"])
  return out


def torch_reference(path, ids, mask, types):
  torch = pytest.importorskip("torch", reason="torch runs the reference BERT (pip install torch==2.13.0)")
  F = torch.nn.functional
  cfg = json.load(open(os.path.join(path, "config.json")))
  w = {k: torch.tensor(v) for k, v in read_safetensors_numpy(os.path.join(path, "model.safetensors")).items()}
  H, nh, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
  ids, mask, types = (torch.tensor(a, dtype=torch.long) for a in (ids, mask, types))
  B, S = ids.shape

  def ln(x, p):
    return F.layer_norm(x, (H,), w[p + ".weight"], w[p + ".bias"], eps)

  def lin(x, p):
    return F.linear(x, w[p + ".weight"], w[p + ".bias"])
  with torch.no_grad():
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][torch.arange(S)][None] \
      + w["embeddings.token_type_embeddings.weight"][types]
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for i in range(cfg["num_hidden_layers"]):
      p = f"encoder.layer.{i}."
      q, k, v = (lin(x, p + "attention.self." + n).view(B, S, nh, H // nh).transpose(1, 2) for n in ("query", "key", "value"))
      att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(H // nh) + bias, -1) @ v
      x = ln(lin(att.transpose(1, 2).reshape(B, S, H), p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
      x = ln(lin(F.gelu(lin(x, p + "intermediate.dense")), p + "output.dense") + x, p + "output.LayerNorm")
    m = mask[..., None].float()
    pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, dim=-1).numpy()


def test_embeddings_match_torch_reference():
  path = _require_model()
  from tiny_nn.examples.embed import SentenceEncoder
  enc = SentenceEncoder(path)
  ours = enc.encode(SENTENCES)
  ref = torch_reference(path, *enc.tokenize(SENTENCES))
  assert ours.shape == ref.shape == (20, 384)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
  cos = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
  assert cos.min() >= 0.9999, cos
  # semantics sanity: paraphrases are closer than unrelated sentences
  assert ours[0] @ ours[1] > ours[0] @ ours[9] + 0.3


def test_known_id_lookup_equals_embedding_layer():
  path = _require_model()
  from tiny_nn.examples.embed import SentenceEncoder
  emb = SentenceEncoder(path).model.embeddings
  ids = np.array([[101, 2023, 2003, 102], [101, 30521, 0, 0]], dtype=np.int32)
  np.testing.assert_array_equal(emb.embed_known_ids(ids).numpy(), emb.word_embeddings(Tensor(ids)).numpy())
  with pytest.raises(ValueError, match="token ids"):
    emb.embed_known_ids(np.array([[40000]]))
