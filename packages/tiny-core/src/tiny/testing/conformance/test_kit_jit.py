"""TinyJit on the device under test: capture, replay with new data, outputs that do not alias, state updated in place,
symbolic shapes, and the device's graph executor (DeviceSpec.graph) where it has one."""
from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine import realize
from tiny.engine.jit import GraphRunner, TinyJit
from tiny.engine.realize import CompiledRunner, ExecItem
from tiny.registry import Device
from tiny.shape.symbolic import Variable
from tiny.tensor import Tensor

from ._kit import QUICK, check, data

F32 = dtypes.float32
CALLS = 5


def _runners(items: List[ExecItem]) -> List[Any]:
  """The runners of a jit cache, with graph executors opened up (to see which kernels they launch)."""
  out: List[Any] = []
  for ei in items:
    out.append(ei.prg)
    if isinstance(ei.prg, GraphRunner):
      out += _runners(ei.prg.jit_cache)
  return out


def _assert_captured_on(jit: TinyJit, device: str) -> None:
  assert jit.cnt >= 2 and jit.jit_cache, "the function was not captured (it should be from its second call)"
  kernels = [r for r in _runners(jit.jit_cache) if isinstance(r, CompiledRunner)]
  assert kernels, "the capture holds no compiled kernels"
  assert all(r.dname == device for r in kernels), f"captured kernels ran on {sorted({r.dname for r in kernels})}, not {device}"


def _mlp_step(w1: Tensor, w2: Tensor) -> Any:
  def step(x: Tensor, y: Tensor) -> Tensor:
    return ((x @ w1).relu() @ w2 + y).sum(1).realize()
  return step


def _mlp_np(x: np.ndarray, y: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
  x, y, w1, w2 = (v.astype(np.float64) for v in (x, y, w1, w2))
  return (np.maximum(x @ w1, 0) @ w2 + y).sum(1)


@QUICK
def test_replay_matches_eager_and_numpy(tiny_device):
  """Every call gets new input data; replays (calls 3..) compute on it, not on what the capture saw."""
  w1n, w2n = data((6, 8), F32, seed=1), data((8, 3), F32, seed=2)
  w1, w2 = Tensor(w1n, device=tiny_device).realize(), Tensor(w2n, device=tiny_device).realize()
  eager, jitted = _mlp_step(w1, w2), TinyJit(_mlp_step(w1, w2))
  for i in range(CALLS):
    x, y = data((4, 6), F32, seed=10 + i), data((4, 3), F32, seed=20 + i)
    got = jitted(Tensor(x, device=tiny_device), Tensor(y, device=tiny_device))
    assert got.device == tiny_device
    want_eager = eager(Tensor(x, device=tiny_device), Tensor(y, device=tiny_device)).numpy()
    g = check(got, _mlp_np(x, y, w1n, w2n), dt=F32, atol=1e-5, rtol=1e-5, what=f"jit call {i + 1}")
    np.testing.assert_allclose(g, want_eager, atol=1e-6, rtol=1e-6, err_msg=f"jit call {i + 1} differs from eager on {tiny_device}")
  _assert_captured_on(jitted, tiny_device)


@QUICK
def test_outputs_do_not_alias_between_calls(tiny_device):
  @TinyJit
  def f(a: Tensor) -> Tuple[Tensor, Tensor]:
    return (a * 2 + 1).realize(), (a - 3).max(0).realize()

  inputs = [data((3, 4), F32, seed=30 + i) for i in range(CALLS)]
  outs = [f(Tensor(a, device=tiny_device)) for a in inputs]
  # read back only now, after every call: a later replay writing into an earlier call's buffer shows up here
  for i, (a, (o1, o2)) in enumerate(zip(inputs, outs)):
    check(o1, a * 2 + 1, dt=F32, what=f"output 1 of call {i + 1}, read after all calls")
    check(o2, (a - 3).max(0), dt=F32, what=f"output 2 of call {i + 1}, read after all calls")
  bufs = [o.lazydata.base.realized for pair in outs[2:] for o in pair]
  assert len({id(b) for b in bufs}) == len(bufs), "replays returned outputs sharing a buffer"


def test_kwargs_dict_outputs_and_constants(tiny_device):
  @TinyJit
  def f(a: Tensor, *, b: Tensor) -> dict:
    return {"sum": (a + b).realize(), "dot": (a * b).sum().realize(), "lin": (Tensor.linspace(0, 1, 4, device=a.device) + b[0]).realize()}

  for i in range(CALLS):
    a, b = data((4,), F32, seed=40 + i), data((4,), F32, seed=50 + i)
    out = f(Tensor(a, device=tiny_device), b=Tensor(b, device=tiny_device))
    check(out["sum"], a + b, dt=F32, what=f"a + b, call {i + 1}")
    check(out["dot"], (a.astype(np.float64) * b).sum(), dt=F32, atol=1e-5, rtol=1e-5, what=f"sum(a * b), call {i + 1}")
    check(out["lin"], np.linspace(0, 1, 4) + b[0], dt=F32, atol=1e-6, what=f"linspace + b[0], call {i + 1}")


def test_outputs_read_by_later_kernels_views_and_repeats(tiny_device):
  """An output that a later kernel of the same call also reads, an output returned as a view, and one returned twice:
  each replay's fresh buffers must be wired into every kernel that touches them."""
  @TinyJit
  def f(a: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    b = (a * 2).realize()
    c = (b + 1).sum(1).realize()
    return b, c, b[1:, ::2], c

  for i in range(CALLS):
    an = data((3, 4), F32, seed=140 + i)
    b, c, bv, c2 = f(Tensor(an, device=tiny_device))
    check(b, an * 2, dt=F32, what=f"intermediate output, call {i + 1}")
    check(c, (an.astype(np.float64) * 2 + 1).sum(1), dt=F32, atol=1e-5, rtol=1e-5, what=f"output of a kernel reading it, call {i + 1}")
    check(bv, (an * 2)[1:, ::2], dt=F32, what=f"view of an output, call {i + 1}")
    check(c2, (an.astype(np.float64) * 2 + 1).sum(1), dt=F32, atol=1e-5, rtol=1e-5, what=f"output returned twice, call {i + 1}")


def test_returned_inputs_are_this_calls_inputs(tiny_device):
  """Returning an input (or a view of one) next to a computed output gives that call's input back."""
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    return a, b[::2], (a + b).realize()

  for i in range(CALLS):
    an, bn = data((6,), F32, seed=150 + i), data((6,), F32, seed=160 + i)
    a, bv, s = f(Tensor(an, device=tiny_device), Tensor(bn, device=tiny_device))
    check(a, an, dt=F32, what=f"returned input, call {i + 1}")
    check(bv, bn[::2], dt=F32, what=f"returned view of an input, call {i + 1}")
    check(s, an + bn, dt=F32, what=f"computed output, call {i + 1}")


@QUICK
def test_state_updated_in_place(tiny_device):
  """A jitted step that assigns to a tensor it closes over (an optimizer-style update) accumulates across replays."""
  wn = data((3, 4), F32, seed=60)
  w = Tensor(wn, device=tiny_device).realize()

  @TinyJit
  def step(x: Tensor) -> Tensor:
    w.assign(w * 0.5 + x).realize()
    return (w.sum(1) * 1).realize()

  want = wn.astype(np.float64)
  for i in range(CALLS):
    x = data((3, 4), F32, seed=61 + i)
    want = want * 0.5 + x
    check(step(Tensor(x, device=tiny_device)), want.sum(1), dt=F32, atol=1e-5, rtol=1e-5, what=f"returned row sums, call {i + 1}")
    check(w, want, dt=F32, atol=1e-6, rtol=1e-6, what=f"updated state, call {i + 1}")


def test_training_step_matches_eager(tiny_device):
  """Forward, backward and an SGD update inside one jitted step: the weights follow the eager run."""
  w1n, w2n = data((6, 8), F32, seed=70, low=-0.5, high=0.5), data((8, 2), F32, seed=71, low=-0.5, high=0.5)

  def make() -> Tuple[Any, List[Tensor]]:
    ws = [Tensor(w1n, device=tiny_device, requires_grad=True), Tensor(w2n, device=tiny_device, requires_grad=True)]

    def step(x: Tensor, y: Tensor) -> Tensor:
      loss = ((x @ ws[0]).relu() @ ws[1] - y).square().mean()
      loss.backward()
      for w in ws:
        assert w.grad is not None
        w.assign(w.detach() - w.grad * 0.1)
        w.grad = None
      Tensor.realize(*ws)
      return loss.realize()
    return step, ws

  (eager, we), (jstep, wj) = make(), make()
  jitted = TinyJit(jstep)
  for i in range(4):
    x, y = data((5, 6), F32, seed=72 + i), data((5, 2), F32, seed=80 + i)
    le = eager(Tensor(x, device=tiny_device), Tensor(y, device=tiny_device)).numpy()
    lj = jitted(Tensor(x, device=tiny_device), Tensor(y, device=tiny_device)).numpy()
    np.testing.assert_allclose(lj, le, atol=1e-6, rtol=1e-5, err_msg=f"loss of step {i + 1} on {tiny_device}")
  for a, b in zip(wj, we):
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=1e-5, err_msg=f"weights after the jitted steps on {tiny_device}")
  _assert_captured_on(jitted, tiny_device)


def test_input_views(tiny_device):
  """Inputs that are views into bigger buffers (an offset and a stride): each call reads its own buffer."""
  @TinyJit
  def f(a: Tensor) -> Tensor:
    return (a * 3).realize()

  for i in range(CALLS):
    base = data((6, 5), F32, seed=90 + i)
    check(f(Tensor(base, device=tiny_device).realize()[1:5, ::2]), base[1:5, ::2] * 3, dt=F32, what=f"view input, call {i + 1}")


@QUICK
@pytest.mark.parametrize("ns", [(3, 5, 1, 8, 5, 2)], ids=["n=3,5,1,8,5,2"])
def test_symbolic_shapes(ns, tiny_device):
  """One capture serves every value of a bound Variable: the kernels take it as an argument."""
  vi = Variable("n", 1, 8)

  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor]:
    return (a * b + 1).sum(1).realize(), (a - b).max(1).realize()

  an, bn = data((4, 8), F32, seed=100), data((4, 8), F32, seed=101)
  ta, tb = Tensor(an, device=tiny_device).realize(), Tensor(bn, device=tiny_device).realize()
  compiled = None
  for k, n in enumerate(ns):
    if k == 2:
      compiled = len(realize.method_cache)
    v = vi.bind(n)
    s, m = f(ta.shrink(((0, 4), (0, v))), tb.shrink(((0, 4), (0, v))))
    a, b = an[:, :n].astype(np.float64), bn[:, :n].astype(np.float64)
    check(s, (a * b + 1).sum(1), dt=F32, atol=1e-5, rtol=1e-5, what=f"sum over n={n}")
    check(m, (a - b).max(1), dt=F32, atol=1e-6, rtol=1e-6, what=f"max over n={n}")
  assert len(realize.method_cache) == compiled, "replays with other variable values compiled new kernels"
  _assert_captured_on(f, tiny_device)


# *** the device's graph executor ***

def _graph_or_skip(device: str) -> Any:
  graph = Device[device].graph
  if graph is None:
    pytest.skip(f"{device} has no graph executor (DeviceSpec.graph is None): the JIT replays its kernels one by one")
  return graph


def _graph_runners(jit: TinyJit, graph: Any) -> List[GraphRunner]:
  found = [ei.prg for ei in jit.jit_cache if isinstance(ei.prg, GraphRunner)]
  assert found, f"the JIT did not batch the captured kernels into the device's graph executor {graph}: cache holds " \
                f"{[type(ei.prg).__name__ for ei in jit.jit_cache]}"
  if isinstance(graph, type):
    assert all(isinstance(r, graph) for r in found), f"graph runners {[type(r).__name__ for r in found]} are not {graph.__name__}"
  return found


@QUICK
def test_graph_executor_is_used_and_correct(tiny_device):
  graph = _graph_or_skip(tiny_device)
  w1n, w2n = data((6, 8), F32, seed=110), data((8, 3), F32, seed=111)
  w1, w2 = Tensor(w1n, device=tiny_device).realize(), Tensor(w2n, device=tiny_device).realize()
  jitted = TinyJit(_mlp_step(w1, w2))
  results = []
  for i in range(CALLS):
    x, y = data((4, 6), F32, seed=112 + i), data((4, 3), F32, seed=120 + i)
    results.append((jitted(Tensor(x, device=tiny_device), Tensor(y, device=tiny_device)), _mlp_np(x, y, w1n, w2n)))
  runners = _graph_runners(jitted, graph)
  assert sum(len(r.jit_cache) for r in runners) >= 2, "a graph runner should batch several kernels"
  for i, (got, want) in enumerate(results):
    check(got, want, dt=F32, atol=1e-5, rtol=1e-5, what=f"graph replay {i + 1}, read after all calls")


def test_graph_executor_with_state_and_many_kernels(tiny_device):
  """A longer chain (several dependent kernels, intermediates sharing memory) plus an in-place update, in the graph."""
  graph = _graph_or_skip(tiny_device)
  sn = np.zeros((4,), np.float32)
  state = Tensor(sn, device=tiny_device).realize()

  @TinyJit
  def f(a: Tensor) -> Tensor:
    h = a.exp().contiguous()
    h = (h / h.sum(1, keepdim=True)).contiguous()
    h = (h * 2).flip(1).contiguous().permute(1, 0).contiguous()
    state.assign(state + h.max(0)).realize()
    return (h.sum(0) + state).realize()

  acc = sn.astype(np.float64)
  for i in range(CALLS):
    a = data((4, 5), F32, seed=130 + i)
    e = np.exp(a.astype(np.float64))
    h = (e / e.sum(1, keepdims=True) * 2)[:, ::-1].T
    acc = acc + h.max(0)
    check(f(Tensor(a, device=tiny_device)), h.sum(0) + acc, dt=F32, atol=1e-5, rtol=1e-5, what=f"graph chain, call {i + 1}")
  check(state, acc, dt=F32, atol=1e-5, rtol=1e-5, what="state updated through the graph")
  _graph_runners(f, graph)


def test_graph_executor_with_symbolic_shapes(tiny_device):
  """The graph executor patches the Variable's value into its kernels at every replay."""
  graph = _graph_or_skip(tiny_device)
  vi = Variable("m", 1, 10)

  @TinyJit
  def f(a: Tensor) -> Tensor:
    return ((a + 1).contiguous() * (a.sum(1, keepdim=True) + 2)).sum(1).realize()

  an = data((3, 10), F32, seed=140)
  ta = Tensor(an, device=tiny_device).realize()
  for n in (4, 7, 2, 10, 4):
    a = an[:, :n].astype(np.float64)
    check(f(ta.shrink(((0, 3), (0, vi.bind(n))))), ((a + 1) * (a.sum(1, keepdims=True) + 2)).sum(1), dt=F32, atol=1e-5, rtol=1e-5,
          what=f"graph with n={n}")
  _graph_runners(f, graph)
