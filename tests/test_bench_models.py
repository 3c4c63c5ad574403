"""The bench's GPT-2 computes what its torch twin computes: prefill, then decode steps over the KV cache, with both
attention styles. The bench rows time this model, so a fusion or heuristic that changes its results (row kernels for
layernorm/softmax, symbolic reshapes of the cache, matrix-vector strips) must fail here first."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
torch = pytest.importorskip("torch", reason="the reference models are written in torch")
from models import gpt2  # noqa: E402


@pytest.mark.parametrize("attention", ["symbolic", "masked"])
def test_gpt2_micro_matches_torch(attention: str) -> None:
  cfg = gpt2.get_config("micro")
  weights = gpt2.random_weights(cfg, seed=3)
  prompt = 12
  prefill, decode, _ = gpt2.tensor_runners("tiny", weights, cfg, prompt, attention=attention)
  ref_prefill, ref_decode, _ = gpt2.torch_runners(weights, cfg, prompt)
  # the JIT captures on its second call and replays from the third: run prefill three times, decode past the capture
  for _ in range(3):
    np.testing.assert_allclose(prefill().numpy(), ref_prefill().numpy(), atol=2e-5, rtol=1e-4)
  for _ in range(5):
    got, want = decode().numpy(), ref_decode().numpy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    assert got.argmax() == want.argmax()


def test_gpt2_wide_decode_matches_torch() -> None:
  """Layers wide enough (d=512: 3-4 MiB up- and down-projections) that the CPU devices split decode's matrix-vector
  products along the reduce (tiny_clang.matvec_split): the decoded logits still match torch's, step after step."""
  cfg = gpt2.get_config("2,512,8,1024")
  weights = gpt2.random_weights(cfg, seed=5)
  prompt = 8
  prefill, decode, _ = gpt2.tensor_runners("tiny", weights, cfg, prompt)
  ref_prefill, ref_decode, _ = gpt2.torch_runners(weights, cfg, prompt)
  np.testing.assert_allclose(prefill().numpy(), ref_prefill().numpy(), atol=5e-5, rtol=1e-4)
  for _ in range(5):
    got, want = decode().numpy(), ref_decode().numpy()
    np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)
    assert got.argmax() == want.argmax()
