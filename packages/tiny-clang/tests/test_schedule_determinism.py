"""Scheduling and code generation are the same in every process: a small training step (conv, batchnorm, pooling,
cross-entropy, backward, an Adam-like update) run in two fresh interpreters with different PYTHONHASHSEEDs and empty
compile caches gives the same schedule (kernel names, buffer counts, sources, in run order) and builds its runners in
the same order (the order DEBUG>=4 prints sources in). A set or dict iterated by object id, a weakref dying at a
different time or the order in which parallel compiles finish would each show up here as a difference."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest

from tiny_clang.compiler import find_cc

if find_cc() is None:
  pytest.skip("no C compiler (clang/cc/gcc) on this machine", allow_module_level=True)

# runs in the child: prints one JSON object with the schedule (in run order) and the runners (in construction order)
_STEP = r'''
import hashlib, json
import numpy as np
from tiny import Tensor
from tiny.engine import realize
from tiny.helpers import ansistrip

def digest(src):
  return hashlib.sha256(src.encode()).hexdigest()[:16]

built, ran = [], []
real_init, real_lower = realize.CompiledRunner.__init__, realize.lower_schedule
def init(self, p, precompiled=None):
  built.append([ansistrip(p.name), digest(p.src)])
  real_init(self, p, precompiled)
def lower(schedule):
  for ei in real_lower(schedule):
    p = getattr(ei.prg, "p", None)
    ran.append([ansistrip(ei.prg.display_name), len(ei.bufs), digest(p.src) if p is not None else None])
    yield ei
realize.CompiledRunner.__init__, realize.lower_schedule = init, lower

Tensor.manual_seed(3)
rng = np.random.default_rng(0)
w1, w2 = Tensor(rng.standard_normal((4, 1, 3, 3), dtype=np.float32), requires_grad=True), Tensor(rng.standard_normal((4, 4, 3, 3), dtype=np.float32), requires_grad=True)
gamma, beta = Tensor.ones(4, requires_grad=True).contiguous(), Tensor.zeros(4, requires_grad=True).contiguous()
head = Tensor(rng.standard_normal((144, 5), dtype=np.float32), requires_grad=True)
params = [w1, w2, gamma, beta, head]
moments = [Tensor.zeros(*p.shape).contiguous() for p in params]
Tensor.realize(*params, *moments)
x = Tensor(rng.random((3, 1, 16, 16), dtype=np.float32)).realize()
y = Tensor(np.array([0, 3, 4], dtype=np.int32)).realize()
for _ in range(2):
  h = x.conv2d(w1).relu().conv2d(w2).relu()
  mean, var = h.mean(axis=(0, 2, 3), keepdim=True), h.var(axis=(0, 2, 3), keepdim=True)
  h = ((h - mean) * (var + 1e-5).rsqrt() * gamma.reshape(1, 4, 1, 1) + beta.reshape(1, 4, 1, 1)).max_pool2d()
  loss = h.flatten(1).dot(head).sparse_categorical_crossentropy(y)
  for p in params:
    p.grad = None
  loss.backward()
  for p, m in zip(params, moments):
    m.assign(m * 0.9 + p.grad * 0.1)
    p.assign(p.detach() - m * 0.01)
  Tensor.realize(loss, *params, *moments)
print(json.dumps({"built": built, "ran": ran, "loss": loss.item()}))
'''


def _run(hashseed: str, cache: Path) -> Dict[str, Any]:
  env = {**os.environ, "PYTHONHASHSEED": hashseed, "CACHEDB": str(cache), "CLANG": "1"}
  for k in ("DEBUG", "BEAM", "NOOPT", "PARALLEL_COMPILE"):
    env.pop(k, None)
  out = subprocess.run([sys.executable, "-c", _STEP], env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_training_step_is_the_same_in_every_process(tmp_path: Path) -> None:
  a, b = _run("1", tmp_path / "a.db"), _run("2", tmp_path / "b.db")
  assert len(a["ran"]) > 20, "the step should schedule many kernels"
  # the ops and kernels are the same and run in the same order, each with the same buffers and the same source
  assert a["ran"] == b["ran"]
  # with empty caches the runners come from the parallel compile: they are still built in one order
  assert a["built"] == b["built"]
  assert a["loss"] == b["loss"]
