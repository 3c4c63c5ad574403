"""A short tiny demo: a two-layer forward pass and its gradients, checked against numpy.

Run with `python -m nox -s demo` (or `python examples/demo.py` where tiny is installed). DEVICE=NAME picks the device.
"""
from __future__ import annotations

import time

import numpy as np

from tiny import Device, Tensor


def main() -> None:
  rng = np.random.default_rng(0)
  x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 4)])
  print(f"tiny on {Device.DEFAULT}")

  st = time.perf_counter()
  tx, tw1, tw2 = Tensor(x), Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
  out = (tx @ tw1).relu() @ tw2
  loss = out.sum()
  loss.backward()
  got_out, got_loss, got_g1 = out.numpy(), loss.item(), tw1.grad.numpy()
  elapsed = time.perf_counter() - st

  h = x @ w1
  want_out = np.maximum(h, 0) @ w2
  want_g1 = x.T @ ((h > 0) * (np.ones((8, 4), np.float32) @ w2.T))
  np.testing.assert_allclose(got_out, want_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got_loss, want_out.sum(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(got_g1, want_g1, rtol=1e-4, atol=1e-4)
  print(f"relu(x @ w1) @ w2 on {out.device}: loss {got_loss:.4f} (numpy {want_out.sum():.4f}), dloss/dw1 matches numpy; {elapsed*1e3:.0f} ms")


if __name__ == "__main__":
  main()
