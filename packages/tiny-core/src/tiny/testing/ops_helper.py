"""Compare a tiny op against torch: forward values and gradients, on any device.

```python
from tiny.testing.ops_helper import helper_test_op
helper_test_op([(3, 4), (4,)], lambda x, y: x + y)                        # same code for both frameworks
helper_test_op([(3, 4)], lambda x: x.relu(), lambda x: x.relu(), device="PYTHON")
```

torch is imported only inside the functions, so importing this module needs neither torch nor a device.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Type

import numpy as np

from tiny.tensor import Tensor


def _to_numpy(x: Any) -> np.ndarray:
  import torch
  if isinstance(x, torch.Tensor):
    x = x.detach()
    if x.dtype == torch.bfloat16:
      x = x.float()
    return x.cpu().numpy()
  return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def compare(name: str, tiny_val: Any, torch_val: Any, atol: float, rtol: float, check_shape: bool = True) -> None:
  """Assert that a tiny result matches a torch result (shape and values, NaNs compared as equal)."""
  t = _to_numpy(tiny_val)
  r = _to_numpy(torch_val)
  if check_shape:
    assert t.shape == r.shape, f"{name}: shape mismatch, tiny {t.shape} vs torch {r.shape}"
  if r.dtype == np.bool_ or t.dtype == np.bool_:
    np.testing.assert_equal(t.astype(np.bool_), r.astype(np.bool_), err_msg=f"{name}: values differ")
    return
  np.testing.assert_allclose(t.astype(np.float64), r.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True,
                             err_msg=f"{name}: values differ")


def prepare_test_op(low: float, high: float, shps: Optional[Sequence[Tuple[int, ...]]], vals: Optional[Sequence[Any]] = None,
                    forward_only: bool = False, device: Optional[str] = None, dtype: Any = None, seed: int = 0) -> Tuple[List[Any], List[Any]]:
  """Make matching torch and tiny input tensors: random uniform floats of the given shapes, or the given values."""
  import torch
  if shps is None:
    if vals is None:
      raise ValueError("pass shapes or vals")
    arrays = [np.asarray(v) for v in vals]
  else:
    rng = np.random.default_rng(seed)
    npdt = np.float32 if dtype is None else dtype
    arrays = [rng.uniform(low=low, high=high, size=size).astype(npdt) for size in shps]
  ts = [torch.tensor(a, requires_grad=(not forward_only and np.issubdtype(a.dtype, np.floating))) for a in arrays]
  tst = [Tensor(a, device=device, requires_grad=(not forward_only and np.issubdtype(a.dtype, np.floating))) for a in arrays]
  return ts, tst


def helper_test_op(shps: Optional[Sequence[Tuple[int, ...]]], torch_fxn: Callable[..., Any], tiny_fxn: Optional[Callable[..., Any]] = None,
                   atol: float = 1e-6, rtol: float = 1e-3, grad_atol: float = 1e-4, grad_rtol: float = 1e-3, forward_only: bool = False,
                   vals: Optional[Sequence[Any]] = None, low: float = -2, high: float = 2, device: Optional[str] = None,
                   dtype: Any = None) -> None:
  """Run torch_fxn and tiny_fxn (defaults to torch_fxn) on the same inputs and check the outputs and the input gradients.

  The gradients come from backpropagating mean((out + 1)^2), so they are not all ones."""
  import torch
  if tiny_fxn is None:
    tiny_fxn = torch_fxn
  ts, tst = prepare_test_op(low, high, shps, vals, forward_only, device=device, dtype=dtype)
  out = torch_fxn(*ts)
  ret = tiny_fxn(*tst)
  compare("forward pass", ret, out, atol=atol, rtol=rtol)
  if forward_only or not isinstance(out, torch.Tensor) or not out.requires_grad or not out.is_floating_point():
    return
  (out + 1).square().mean().backward()
  (ret + 1).square().mean().backward()
  for i, (t, tt) in enumerate(zip(ts, tst)):
    if t.grad is None:
      continue
    if tt.grad is None:
      assert t.grad.numel() == 0 or not t.grad.any(), f"input {i}: torch has a gradient, tiny has none"
      continue
    compare(f"backward pass, input {i}", tt.grad, t.grad, atol=grad_atol, rtol=grad_rtol)


def helper_test_exception(shps: Sequence[Tuple[int, ...]], torch_fxn: Callable[..., Any], tiny_fxn: Callable[..., Any],
                          expected: Tuple[Type[BaseException], ...] = (Exception,), exact: bool = False, device: Optional[str] = None) -> None:
  """Check that torch and tiny both reject the inputs (tiny with one of the expected exception types)."""
  import pytest
  ts, tst = prepare_test_op(-2, 2, shps, forward_only=True, device=device)
  with pytest.raises(Exception):
    torch_fxn(*ts)
  with pytest.raises(expected) as info:
    tiny_fxn(*tst).realize()
  if exact:
    assert type(info.value) in expected, f"expected exactly one of {expected}, got {type(info.value)}"


def run_kernel_on_python(k: Any, inputs: Sequence[np.ndarray], out_shape: Tuple[int, ...]) -> np.ndarray:
  """Linearize Kernel k (a float32 kernel with one output), check the uop order, and run it on the PYTHON interpreter
  with inputs; the output as an array of out_shape. For tests of opts and heuristics, whatever renderer k was built for."""
  from tiny.codegen.uopgraph import verify_linearized
  from tiny.runtime.ops_python import PythonProgram
  prg = k.to_program()
  assert k.uops is not None
  verify_linearized(k.uops.uops)
  out = np.zeros(out_shape, np.float32)
  mvs = [memoryview(bytearray(out.nbytes)).cast("f")] + [memoryview(bytearray(np.ascontiguousarray(x, np.float32).tobytes())).cast("f")
                                                          for x in inputs]
  gs, ls = prg.launch_dims({})
  PythonProgram(prg.name, prg.src.encode() if isinstance(prg.src, str) else prg.src)(*mvs, global_size=tuple(gs), local_size=tuple(ls or (1, 1, 1)))
  return np.frombuffer(mvs[0].tobytes(), np.float32).reshape(out_shape)
