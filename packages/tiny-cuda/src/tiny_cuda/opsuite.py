"""A representative suite of kernels for checking the CUDA renderers without a GPU.

`op_suite_asts()` builds kernels the way a program does (Tensor ops -> schedule) on the PYTHON device, so the ASTs are
exactly what the scheduler produces; `render_suite()` turns each into a Program for a renderer, with or without the
heuristic optimizations. `python -m tiny_cuda.opsuite [sm_80 ...]` renders and compiles the whole suite with both renderers.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from tiny.backend import Kernel, KernelOptError, LazyOp, MetaOps, dtypes

SuiteCase = Tuple[str, Callable[[], Any]]


def _cases() -> List[SuiteCase]:
  from tiny import Tensor, Variable   # the user API: the suite builds kernels the way a program does

  def t(*shape: int, dtype: Any = dtypes.float32) -> Any:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")

  x, y = t(4, 33), t(4, 33)
  v = Variable("n", 1, 64)
  return [
    ("add", lambda: x + y), ("mul_sub_div", lambda: (x * y - 2.0) / (y + 3.0)), ("neg_abs_max", lambda: (-x).abs().maximum(y)),
    ("exp_log", lambda: x.exp() + x.exp2() + y.log()), ("sin_sqrt", lambda: x.sin() * y.sqrt()), ("sigmoid_tanh", lambda: x.sigmoid() + y.tanh()),
    ("gelu_relu", lambda: x.gelu() + y.relu()), ("where_cmp", lambda: (x < y).where(x, y) + (x == 1.0).where(1.0, 0.0)),
    ("float4_vec", lambda: t(64, 64) * 2.0 + t(64, 64)),
    ("reduce_sum", lambda: t(64, 96).sum(axis=1)), ("reduce_max", lambda: t(96, 64).max(axis=0)), ("reduce_all", lambda: t(1024).sum()),
    ("mean_var", lambda: t(16, 64).var(axis=1)), ("softmax", lambda: t(8, 100).softmax()), ("argmax", lambda: t(8, 40).argmax(axis=1)),
    ("layernorm", lambda: t(8, 64).layernorm()), ("cumsum", lambda: t(50).cumsum()), ("arange", lambda: Tensor.arange(100, device="PYTHON") * 3),
    ("matmul", lambda: t(64, 64) @ t(64, 64)), ("matvec", lambda: t(256, 128) @ t(128)),
    ("conv2d", lambda: t(1, 4, 12, 12).conv2d(t(8, 4, 3, 3))), ("max_pool", lambda: t(1, 2, 8, 8).max_pool2d()),
    ("pad_shrink", lambda: t(6, 6).pad(((1, 2), (0, 3))).shrink(((0, 7), (1, 8))) + 1.0), ("permute", lambda: t(16, 8).permute(1, 0).contiguous()),
    ("one_hot", lambda: t(10, dtype=dtypes.int32).one_hot(7)),
    ("int_ops", lambda: (t(64, dtype=dtypes.int32) // 3) * 7 + t(64, dtype=dtypes.int32) % 5),
    ("bitwise", lambda: (t(64, dtype=dtypes.int32) ^ t(64, dtype=dtypes.int32)) & 0xFF | 3),
    ("int64_uint8", lambda: t(64, dtype=dtypes.int64) * 3 + t(64, dtype=dtypes.uint8).cast(dtypes.int64)),
    # (threefry's uint64 products fold away now: an explicit one keeps mul.lo.u64 in the suite)
    ("uint64_mul", lambda: t(64, dtype=dtypes.uint64) * t(64, dtype=dtypes.uint64) + 5),
    ("float64", lambda: (t(32, dtype=dtypes.float64) * 1.5).exp() + t(32, dtype=dtypes.float64).exp2()),
    ("rand", lambda: Tensor.rand(37, device="PYTHON")),
    ("half_ew", lambda: (t(64, dtype=dtypes.half) * 2 + t(64, dtype=dtypes.half)).relu().sqrt()),
    ("half_reduce", lambda: t(32, 64, dtype=dtypes.half).sum(axis=1, acc_dtype=dtypes.float32)),
    ("bf16_ew", lambda: (t(64, dtype=dtypes.bfloat16) * 2 + t(64, dtype=dtypes.bfloat16)).exp() + t(64, dtype=dtypes.bfloat16).exp2()),
    ("casts", lambda: t(64).cast(dtypes.half).cast(dtypes.int8).cast(dtypes.bfloat16).cast(dtypes.float32) +
     t(64, dtype=dtypes.bool).cast(dtypes.float32)),
    ("bitcast", lambda: t(64).bitcast(dtypes.int32) + 1),
    ("half_matmul", lambda: t(64, 64, dtype=dtypes.half).matmul(t(64, 64, dtype=dtypes.half), acc_dtype=dtypes.float32)),
    ("bf16_matmul", lambda: t(64, 64, dtype=dtypes.bfloat16).matmul(t(64, 64, dtype=dtypes.bfloat16), acc_dtype=dtypes.float32)),
    ("symbolic", lambda: (t(64, 32).shrink(((0, v.bind(20)), None)) * 2).sum(axis=1)),
    ("symbolic_reduce", lambda: (t(64, 32).shrink(((0, v.bind(20)), None)) * 2).sum(axis=0)),
  ]


def op_suite_asts(names: Optional[List[str]] = None) -> Dict[str, List[LazyOp]]:
  """{case name: the kernel ASTs its schedule holds} for the suite (or the named cases)."""
  from tiny.backend import create_schedule_with_vars
  out: Dict[str, List[LazyOp]] = {}
  for name, fn in _cases():
    if names is not None and name not in names:
      continue
    sched, _ = create_schedule_with_vars([fn().lazydata])
    out[name] = [si.ast for si in sched if si.ast.op is MetaOps.KERNEL]
  return out


def cast_inside_mul(ast: LazyOp) -> LazyOp:
  """SUM(CAST(MUL(a, b))) -> SUM(MUL(CAST(a), CAST(b))): the form core's tensor-core opt recognizes. `a.matmul(b, acc_dtype=...)`
  multiplies in the input dtype and casts the product, which the TC opt does not match (see the README)."""
  from tiny.backend import BinaryOps, ReduceOps, UnaryOps

  def fix(x: LazyOp) -> LazyOp:
    if x.op is ReduceOps.SUM and x.src[0].op is UnaryOps.CAST and x.src[0].src[0].op is BinaryOps.MUL:
      cast_to, mul = x.src[0].arg, x.src[0].src[0]
      return LazyOp(x.op, (LazyOp(BinaryOps.MUL, tuple(LazyOp(UnaryOps.CAST, (s,), cast_to) for s in mul.src)),), x.arg)
    return LazyOp(x.op, tuple(fix(s) for s in x.src), x.arg)
  return fix(ast)


def tc_matmul_ast(m: int, n: int, k: int, dtype_in: Any) -> LazyOp:
  """The kernel of `A(m x k) @ B(k x n)` with dtype_in inputs and a float32 result, in the tensor-core form."""
  from tiny import Tensor
  from tiny.backend import create_schedule
  a, b = Tensor.empty(m, k, dtype=dtype_in, device="PYTHON"), Tensor.empty(k, n, dtype=dtype_in, device="PYTHON")
  asts = [si.ast for si in create_schedule([a.matmul(b, acc_dtype=dtypes.float32).lazydata]) if si.ast.op is MetaOps.KERNEL]
  assert len(asts) == 1, "a matmul is one kernel"
  return cast_inside_mul(asts[0])


def make_program(ast: LazyOp, renderer: Any, opt: str = "hand") -> Any:
  """The Program of one AST for a renderer; opt is "none", "hand" (hand_coded_optimizations) or "tc" (tensor cores first)."""
  k = Kernel(ast, opts=renderer)
  if opt == "hand":
    k.hand_coded_optimizations()
  elif opt == "tc":
    if not k.apply_tensor_cores(1):
      raise KernelOptError("no tensor core applies to this kernel")
  elif opt != "none":
    raise ValueError(f"opt must be none, hand or tc, not {opt!r}")
  return k.to_program()


def cuda_batch_source(srcs: List[str]) -> str:
  """One CUDA C translation unit holding many rendered kernels (with distinct names): includes are hoisted, everything
  else of kernel i goes in `namespace k<i>`, so one kernel's helper structs never satisfy another's. One NVRTC call
  then checks them all (NVRTC's start-up dominates the time of a small kernel)."""
  includes = sorted({ln for src in srcs for ln in src.splitlines() if ln.startswith("#include")})
  bodies = [f"namespace k{i} {{\n" + "\n".join(ln for ln in src.splitlines() if not ln.startswith("#include")) + "\n}" for i, src in enumerate(srcs)]
  return "\n".join(includes + bodies) + "\n"


def ptx_batch_source(srcs: List[str]) -> str:
  """One PTX module holding the entries of many rendered PTX kernels (with distinct names): one header, then every body."""
  heads = {tuple(src.splitlines()[:3]) for src in srcs}
  if len(heads) != 1:
    raise ValueError(f"the PTX kernels disagree on .version/.target/.address_size: {heads}")
  return "\n".join(list(heads.pop()) + ["\n".join(src.splitlines()[3:]) for src in srcs]) + "\n"


def render_suite(renderer: Any, opt: str = "hand", suite: Optional[Dict[str, List[LazyOp]]] = None) -> List[Any]:
  """Programs of every kernel of the suite for a renderer, named <case>_<i> so that they can share one module."""
  suite = op_suite_asts() if suite is None else suite
  out = []
  for name, asts in suite.items():
    for i, ast in enumerate(asts):
      k = Kernel(ast, opts=renderer)
      if opt == "hand":
        k.hand_coded_optimizations()
      out.append(k.to_program(name_override=f"{name}_{i}"))
  return out


def main(argv: List[str]) -> int:
  """Render and compile the suite for each architecture given (default sm_80 sm_90) with both renderers."""
  from tiny_cuda.compiler import NVRTCCompiler, PTXCompiler
  from tiny_cuda.ptx import PTXRenderer
  from tiny_cuda.renderer import CUDARenderer
  suite = op_suite_asts()
  failed = 0
  for arch in argv or ["sm_80", "sm_90"]:
    for rcls, ccls in ((CUDARenderer, NVRTCCompiler), (PTXRenderer, PTXCompiler)):
      renderer, compiler = rcls(arch), ccls(arch)
      st, n = time.perf_counter(), 0
      for opt in ("none", "hand"):
        for prg in render_suite(renderer, opt, suite):
          try:
            compiler.compile(prg.src)
            n += 1
          except Exception as e:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print(f"FAIL {arch} {rcls.__name__} {prg.name} {opt}: {type(e).__name__}: {str(e)[:2000]}")
      print(f"{arch} {rcls.__name__}: {n} kernels compiled one by one in {time.perf_counter() - st:.2f}s")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
