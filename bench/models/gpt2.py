"""GPT-2 with random weights, written once against the tiny/tinygrad Tensor API and once in plain torch.

Both versions take the same numpy weights (`random_weights`), so their logits agree and the benchmark compares the
same computation. The layout follows the released GPT-2 checkpoints: `c_attn`/`c_fc`/`c_proj` weights are stored
(in_features, out_features) and multiplied from the right, and the language-model head is tied to the token embedding.

`TensorGPT2(module, weights, cfg)` runs on tiny (`module="tiny"`) or on tinygrad (`module="tinygrad"`): the two share
the Tensor, Variable and TinyJit names. Decoding keeps a per-layer key/value cache; the position may be an int or a
bound symbolic `Variable`, so one TinyJit capture serves every position.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple, Union

import numpy as np


@dataclass(frozen=True)
class GPT2Config:
  """Sizes of a GPT-2 model; `max_context` bounds the key/value cache (and the position Variable)."""

  name: str
  n_layer: int
  n_head: int
  n_embd: int
  vocab_size: int = 50257
  n_positions: int = 1024
  max_context: int = 256

  @property
  def n_params(self) -> int:
    d = self.n_embd
    per_layer = 12 * d * d + 13 * d  # qkv + proj + 4x mlp, their biases, two layernorms
    return self.vocab_size * d + self.n_positions * d + self.n_layer * per_layer + 2 * d

  def describe(self) -> str:
    return f"{self.name}: {self.n_layer} layers, d={self.n_embd}, {self.n_head} heads, vocab {self.vocab_size}, {self.n_params / 1e6:.0f}M params"


PRESETS: Dict[str, GPT2Config] = {
  "small": GPT2Config("gpt2-small", 12, 12, 768),
  "mini": GPT2Config("gpt2-mini", 4, 8, 512),
  "micro": GPT2Config("gpt2-micro", 2, 4, 128, vocab_size=1024, n_positions=256, max_context=64),
}


def get_config(name: str) -> GPT2Config:
  """A preset by name, or `layers,embd,heads[,vocab]` for a custom size."""
  if name in PRESETS:
    return PRESETS[name]
  parts = name.split(",")
  if len(parts) not in (3, 4) or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"unknown GPT-2 config {name!r}: use one of {sorted(PRESETS)} or 'layers,embd,heads[,vocab]'")
  nl, d, nh = (int(p) for p in parts[:3])
  if d % nh:
    raise ValueError(f"GPT-2 config {name!r}: embedding width {d} is not a multiple of the head count {nh}")
  return GPT2Config(f"gpt2-{nl}x{d}", nl, nh, d, vocab_size=int(parts[3]) if len(parts) == 4 else 50257)


def random_weights(cfg: GPT2Config, seed: int = 0) -> Dict[str, np.ndarray]:
  """GPT-2-style initialisation (normal, std 0.02; unit layernorms, zero biases) as float32 numpy arrays."""
  rng = np.random.default_rng(seed)
  d = cfg.n_embd

  def normal(*shape: int) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float32)

  w: Dict[str, np.ndarray] = {"wte": normal(cfg.vocab_size, d), "wpe": normal(cfg.n_positions, d),
                              "ln_f.w": np.ones(d, np.float32), "ln_f.b": np.zeros(d, np.float32)}
  for i in range(cfg.n_layer):
    p = f"h{i}."
    w.update({p + "ln_1.w": np.ones(d, np.float32), p + "ln_1.b": np.zeros(d, np.float32),
              p + "ln_2.w": np.ones(d, np.float32), p + "ln_2.b": np.zeros(d, np.float32),
              p + "attn.w": normal(d, 3 * d), p + "attn.b": np.zeros(3 * d, np.float32),
              p + "proj.w": normal(d, d) / np.float32(math.sqrt(2 * cfg.n_layer)), p + "proj.b": np.zeros(d, np.float32),
              p + "fc.w": normal(d, 4 * d), p + "fc.b": np.zeros(4 * d, np.float32),
              p + "mlp_proj.w": normal(4 * d, d) / np.float32(math.sqrt(2 * cfg.n_layer)), p + "mlp_proj.b": np.zeros(d, np.float32)})
  return w


# ---------------------------------------------------------------- tiny / tinygrad

class TensorGPT2:
  """GPT-2 on a tinygrad-style Tensor API. `__call__(tokens, start_pos)` returns the last position's logits (B, 1, vocab)."""

  def __init__(self, module: str, weights: Dict[str, np.ndarray], cfg: GPT2Config, batch: int = 1, attention: str = "symbolic") -> None:
    if attention not in ("symbolic", "masked"):
      raise ValueError(f"attention must be 'symbolic' (keys shrunk to the filled length) or 'masked' (whole cache, -inf mask), not {attention!r}")
    mod = importlib.import_module(module)
    self.Tensor, self.cfg, self.batch, self.attention = mod.Tensor, cfg, batch, attention
    self.w = {k: self.Tensor(v).realize() for k, v in weights.items()}
    # (k/v, batch, position, n_embd): heads stay merged in the cache so a cache write is one contiguous row per k/v
    self.caches = [self.Tensor.zeros(2, batch, cfg.max_context, cfg.n_embd).contiguous().realize() for _ in range(cfg.n_layer)]

  def _layernorm(self, x: Any, name: str) -> Any:
    return x.layernorm(eps=1e-5) * self.w[name + ".w"] + self.w[name + ".b"]

  def _attention(self, x: Any, i: int, start_pos: Union[int, Any]) -> Any:
    cfg, w = self.cfg, self.w
    B, T, d = x.shape
    H, hd = cfg.n_head, d // cfg.n_head
    qkv = x @ w[f"h{i}.attn.w"] + w[f"h{i}.attn.b"]
    q, k, v = (qkv.shrink((None, None, (j * d, (j + 1) * d))) for j in range(3))
    cache = self.caches[i]
    cache.shrink((None, None, (start_pos, start_pos + T), None)).assign(self.Tensor.stack(k, v)).realize()
    mask = None
    if T == 1 and self.attention == "masked":
      # attend over the whole cache; positions not filled yet get -inf, so every kernel keeps a concrete shape
      S = cfg.max_context
      k, v = (cache.shrink(((j, j + 1), None, None, None)).reshape(B, S, H, hd) for j in range(2))
      n = start_pos + 1
      mask = self.Tensor.zeros(S).contiguous().shrink(((0, n),)).pad(((0, S - n),), value=float("-inf")).reshape(1, 1, 1, S)
    elif T == 1:
      keys = cache.shrink((None, None, (0, start_pos + 1), None))
      k, v = (keys.shrink(((j, j + 1), None, None, None)).reshape(B, start_pos + 1, H, hd) for j in range(2))
    elif not (isinstance(start_pos, int) and start_pos == 0):
      raise ValueError("prefill (more than one token) is only supported from position 0")
    else:
      k, v = k.reshape(B, T, H, hd), v.reshape(B, T, H, hd)
    q = q.reshape(B, T, H, hd)
    # (B, H, T, hd); the mask is causal for a prefill from 0 and unnecessary for one new token
    o = q.transpose(1, 2).scaled_dot_product_attention(k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=T > 1)
    o = o.transpose(1, 2).reshape(B, T, d)
    return o @ w[f"h{i}.proj.w"] + w[f"h{i}.proj.b"]

  def __call__(self, tokens: Any, start_pos: Union[int, Any] = 0) -> Any:
    w = self.w
    B, T = tokens.shape
    h = w["wte"][tokens] + w["wpe"].shrink(((start_pos, start_pos + T), None)).reshape(1, T, self.cfg.n_embd)
    for i in range(self.cfg.n_layer):
      h = h + self._attention(self._layernorm(h, f"h{i}.ln_1"), i, start_pos)
      x = self._layernorm(h, f"h{i}.ln_2")
      h = h + ((x @ w[f"h{i}.fc.w"] + w[f"h{i}.fc.b"]).gelu() @ w[f"h{i}.mlp_proj.w"] + w[f"h{i}.mlp_proj.b"])
    last = self._layernorm(h.shrink((None, (T - 1, T), None)), "ln_f")
    return last @ w["wte"].T


def tensor_runners(module: str, weights: Dict[str, np.ndarray], cfg: GPT2Config, prompt_len: int,
                   attention: str = "symbolic") -> Tuple[Any, Any, TensorGPT2]:
  """(prefill(), decode()) closures, both under TinyJit; decode binds the position to a symbolic Variable.

  attention="symbolic" shrinks the cached keys to the filled length (symbolic shapes in the attention kernels);
  "masked" attends over the whole cache with a -inf mask built from the Variable (only the mask and the cache
  write depend on it)."""
  mod = importlib.import_module(module)
  Tensor, TinyJit, Variable = mod.Tensor, mod.TinyJit, mod.Variable
  if prompt_len + 1 >= cfg.max_context:
    raise ValueError(f"prompt of {prompt_len} tokens does not fit max_context {cfg.max_context}")
  model = TensorGPT2(module, weights, cfg, attention=attention)
  prompt = Tensor(np.random.default_rng(1).integers(0, cfg.vocab_size, (1, prompt_len)).astype(np.int32)).realize()

  @TinyJit
  def prefill_jit(toks: Any) -> Any:
    return model(toks, 0).realize()

  # The Variable counts the filled positions (the new token's position + 1), not the position itself: the attention
  # loop then runs to the Variable rather than to `position + 1`, which tiny's linearizer (at the time of writing)
  # emitted after the loop that uses it as a bound. Either way one capture serves every length.
  @TinyJit
  def decode_jit(tok: Any, n_filled: Any) -> Any:
    return model(tok, n_filled - 1).realize()

  state = {"pos": prompt_len}
  var = Variable("n_filled", 2, cfg.max_context)

  def decode() -> Any:
    pos = state["pos"]
    state["pos"] = pos + 1 if pos + 2 < cfg.max_context else prompt_len  # wrap: the cache keeps the prompt
    return decode_jit(Tensor([[pos % cfg.vocab_size]], dtype=prompt.dtype), var.bind(pos + 1))

  return (lambda: prefill_jit(prompt)), decode, model


# ---------------------------------------------------------------- torch

def torch_runners(weights: Dict[str, np.ndarray], cfg: GPT2Config, prompt_len: int) -> Tuple[Any, Any, Any]:
  """The same model in plain torch (eager, inference mode): (prefill(), decode(), model)."""
  import torch
  import torch.nn.functional as F  # noqa: N812

  class TorchGPT2:
    def __init__(self) -> None:
      self.w = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
      self.caches = [torch.zeros(2, 1, cfg.max_context, cfg.n_embd) for _ in range(cfg.n_layer)]

    def ln(self, x: Any, name: str) -> Any:
      return F.layer_norm(x, (cfg.n_embd,), self.w[name + ".w"], self.w[name + ".b"], eps=1e-5)

    def attention(self, x: Any, i: int, start_pos: int) -> Any:
      w = self.w
      B, T, d = x.shape
      H, hd = cfg.n_head, d // cfg.n_head
      qkv = torch.addmm(w[f"h{i}.attn.b"], x.reshape(B * T, d), w[f"h{i}.attn.w"]).reshape(B, T, 3 * d)
      cache = self.caches[i]
      cache[0, :, start_pos:start_pos + T] = qkv[:, :, d:2 * d]
      cache[1, :, start_pos:start_pos + T] = qkv[:, :, 2 * d:]
      q = qkv[:, :, :d].reshape(B, T, H, hd)
      k, v = (cache[j, :, :start_pos + T].reshape(B, start_pos + T, H, hd) for j in range(2))
      o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=T > 1)
      o = o.transpose(1, 2).reshape(B * T, d)
      return torch.addmm(w[f"h{i}.proj.b"], o, w[f"h{i}.proj.w"]).reshape(B, T, d)

    def __call__(self, tokens: Any, start_pos: int) -> Any:
      w = self.w
      B, T = tokens.shape
      h = F.embedding(tokens, w["wte"]) + w["wpe"][start_pos:start_pos + T]
      for i in range(cfg.n_layer):
        h = h + self.attention(self.ln(h, f"h{i}.ln_1"), i, start_pos)
        x = self.ln(h, f"h{i}.ln_2")
        h = h + F.linear(F.gelu(F.linear(x, w[f"h{i}.fc.w"].T, w[f"h{i}.fc.b"]), approximate="tanh"), w[f"h{i}.mlp_proj.w"].T,
                         w[f"h{i}.mlp_proj.b"])
      return self.ln(h[:, -1:], "ln_f") @ w["wte"].T

  model = TorchGPT2()
  prompt = torch.from_numpy(np.random.default_rng(1).integers(0, cfg.vocab_size, (1, prompt_len)).astype(np.int64))
  state = {"pos": prompt_len}

  def prefill() -> Any:
    with torch.inference_mode():
      return model(prompt, 0)

  def decode() -> Any:
    pos = state["pos"]
    state["pos"] = pos + 1 if pos + 2 < cfg.max_context else prompt_len
    with torch.inference_mode():
      return model(torch.tensor([[pos % cfg.vocab_size]]), pos)

  return prefill, decode, model


def flops_per_token(cfg: GPT2Config, context: int) -> float:
  """Matmul FLOPs of one token's forward pass at a given context length (weights + attention), for GFLOP/s figures."""
  d = cfg.n_embd
  return 2.0 * (cfg.n_layer * (12 * d * d + 2 * context * d) + cfg.vocab_size * d)


__all__: List[str] = ["GPT2Config", "PRESETS", "get_config", "random_weights", "TensorGPT2", "tensor_runners", "torch_runners",
                      "flops_per_token"]
