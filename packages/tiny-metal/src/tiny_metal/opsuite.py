"""A representative suite of kernels for checking the Metal renderer without a Mac.

`suite_asts()` builds kernels the way a program does (Tensor ops -> schedule, on the PYTHON device), so the ASTs are exactly
what the scheduler produces. `suite_programs()` renders every one of them with MetalRenderer under several optimization
styles: none, the heuristic ones, explicit GPU-style opts (locals, grouped reductions, upcasts) and, for matmuls, the
simdgroup tensor cores. `python -m tiny_metal.opsuite` renders the suite and syntax-checks it with clang and msl_shim.h.

Cases in UNSUPPORTED are expected to raise RenderError on Metal (it has no double).
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tiny.backend import Kernel, KernelOptError, LazyOp, MetaOps, Opt, OptOps, dtypes

SuiteCase = Tuple[str, Callable[[], Any]]
# case -> why Metal cannot run it
UNSUPPORTED = {"double_math": "Metal has no double"}
OPT_STYLES = ("none", "hand", "gpu")


def _cases() -> List[SuiteCase]:
  from tiny import Tensor, Variable   # the user API: the suite builds kernels the way a program does

  def e(*shape: int, dtype: Any = dtypes.float32) -> Any:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")

  a, b = e(5, 31), e(5, 31)
  n = Variable("n", 1, 48)
  i32 = dtypes.int32
  return [
    ("elementwise", lambda: (a + b) * (a - 1.5) / (b + 2.0)), ("unary_math", lambda: a.exp2() + b.log2() + a.sin() + b.sqrt()),
    ("neg_abs_recip", lambda: (-a).abs() + b.reciprocal()), ("maximum_nan", lambda: a.maximum(b) + a.relu()),
    ("activations", lambda: a.sigmoid() + b.tanh() + a.gelu() + b.silu()), ("compare_where", lambda: (a < b).where(a, b * 2) + (a != b)),
    ("vector_io", lambda: e(32, 64) * 3.0 + e(32, 64)), ("broadcast", lambda: e(16, 1) + e(1, 24)),
    ("sum_rows", lambda: e(48, 80).sum(axis=1)), ("max_cols", lambda: e(80, 48).max(axis=0)), ("sum_all", lambda: e(2048).sum()),
    ("variance", lambda: e(12, 70).var(axis=1)), ("softmax", lambda: e(6, 130).softmax()), ("argmax", lambda: e(6, 50).argmax(axis=1)),
    ("layernorm", lambda: e(4, 96).layernorm()), ("cumsum", lambda: e(40).cumsum()), ("arange", lambda: Tensor.arange(77, device="PYTHON") + 1),
    ("matmul", lambda: e(48, 40) @ e(40, 56)), ("matvec", lambda: e(200, 96) @ e(96)),
    ("conv2d", lambda: e(1, 3, 10, 10).conv2d(e(6, 3, 3, 3), padding=1)), ("avg_pool", lambda: e(1, 2, 8, 8).avg_pool2d()),
    ("pad_shrink", lambda: e(5, 7).pad(((2, 1), (0, 2))).shrink(((1, 7), (0, 8))) * 2.0), ("transpose", lambda: e(24, 12).T.contiguous()),
    ("one_hot", lambda: e(12, dtype=i32).one_hot(9)),
    ("int_arith", lambda: (e(64, dtype=i32) // 5) * 3 + e(64, dtype=i32) % 7 - e(64, dtype=i32).maximum(2)),
    ("bit_ops", lambda: ((e(64, dtype=i32) ^ e(64, dtype=i32)) & 0x7F | 5) + (e(64, dtype=dtypes.uint32) << 2)),
    ("wide_narrow_ints", lambda: e(64, dtype=dtypes.int64) * 7 + e(64, dtype=dtypes.uint8).cast(dtypes.int64) +
     e(64, dtype=dtypes.int16).cast(dtypes.int64) + e(64, dtype=dtypes.uint16).cast(dtypes.int64) +
     e(64, dtype=dtypes.uint64).cast(dtypes.int64)),
    ("bool_logic", lambda: ((e(64) > 0) & (e(64) < 1)).cast(dtypes.float32)),
    ("rand", lambda: Tensor.rand(45, device="PYTHON")),
    ("half_math", lambda: (e(64, dtype=dtypes.half) * 3 + e(64, dtype=dtypes.half)).relu().sqrt() + e(64, dtype=dtypes.half).exp2()),
    ("half_reduce", lambda: e(24, 64, dtype=dtypes.half).sum(axis=1, acc_dtype=dtypes.float32)),
    ("bf16_math", lambda: (e(64, dtype=dtypes.bfloat16) * 2 - e(64, dtype=dtypes.bfloat16)).exp() + e(64, dtype=dtypes.bfloat16).sin()),
    ("bf16_reduce", lambda: e(16, 64, dtype=dtypes.bfloat16).max(axis=1)),
    ("casts", lambda: e(64).cast(dtypes.half).cast(dtypes.int8).cast(dtypes.bfloat16).cast(dtypes.int32).cast(dtypes.float32) +
     e(64, dtype=dtypes.bool).cast(dtypes.bfloat16).cast(dtypes.float32)),
    ("bitcasts", lambda: e(64).bitcast(dtypes.uint32) + 3 + e(64, dtype=dtypes.half).bitcast(dtypes.int16).cast(dtypes.uint32)),
    ("half_matmul", lambda: e(32, 48, dtype=dtypes.half) @ e(48, 40, dtype=dtypes.half)),
    ("symbolic_elementwise", lambda: e(48, 16).shrink(((0, n.bind(13)), None)) + 1.0),
    ("symbolic_reduce", lambda: (e(48, 16).shrink(((0, n.bind(13)), None)) * 2).sum(axis=0)),
    ("double_math", lambda: (e(16, dtype=dtypes.float64) * 2.5).exp2()),
  ]


def case_names() -> List[str]:
  """The names of the suite's cases, in order."""
  return [name for name, _ in _cases()]


def suite_asts(names: Optional[Sequence[str]] = None) -> Dict[str, List[LazyOp]]:
  """{case: the kernel ASTs of its schedule} for the suite (or the named cases)."""
  from tiny.backend import create_schedule_with_vars
  out: Dict[str, List[LazyOp]] = {}
  for name, fn in _cases():
    if names is not None and name not in names:
      continue
    sched, _ = create_schedule_with_vars([fn().lazydata])
    out[name] = [si.ast for si in sched if si.ast.op is MetaOps.KERNEL]
  return out


def gpu_opts(k: Kernel) -> None:
  """Explicit GPU-style opts, the way a tuned Metal kernel looks: a reduction over a long axis is split across a
  threadgroup (GROUPTOP, which needs threadgroup memory and a barrier); otherwise the first output axis gets 16 threads of
  a threadgroup (LOCAL) and the next a 4-wide upcast. An opt the kernel does not admit is skipped."""
  def attempt(*opts: Opt) -> bool:
    for o in opts:
      try:
        k.apply_opt(o)
        return True
      except KernelOptError:
        continue
    return False
  if k.reduceop is not None:
    attempt(Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.GROUP, 0, 4))
  attempt(Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.LOCAL, 0, 2))
  attempt(Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4))


def optimize(k: Kernel, opt: str) -> Kernel:
  """Apply an optimization style to a kernel: "none", "hand" (hand_coded_optimizations), "gpu" (gpu_opts) or "tc" (tensor
  cores, which must apply)."""
  if opt == "hand":
    k.hand_coded_optimizations()
  elif opt == "gpu":
    gpu_opts(k)
  elif opt == "tc":
    if not k.apply_tensor_cores(1):
      raise KernelOptError("no tensor core applies to this kernel")
  elif opt != "none":
    raise ValueError(f"opt must be one of none, hand, gpu, tc, not {opt!r}")
  return k


def make_program(ast: LazyOp, renderer: Any, opt: str = "hand", name: Optional[str] = None) -> Any:
  """The Program of one AST for a renderer under an optimization style (see `optimize`)."""
  k = optimize(Kernel(ast, opts=renderer), opt)
  return k.to_program(name_override=name) if name is not None else k.to_program()


def acc_inside_mul(ast: LazyOp) -> LazyOp:
  """SUM(CAST(MUL(a, b))) -> SUM(MUL(CAST(a), CAST(b))). `matmul(..., acc_dtype=)` multiplies in the input dtype and casts
  the product, a form the tensor-core opt does not take; multiplying the cast inputs is the mixed-precision matmul it does."""
  from tiny.backend import BinaryOps, ReduceOps, UnaryOps

  def walk(x: LazyOp) -> LazyOp:
    if x.op is ReduceOps.SUM and x.src[0].op is UnaryOps.CAST and x.src[0].src[0].op is BinaryOps.MUL:
      mul, to = x.src[0].src[0], x.src[0].arg
      return LazyOp(x.op, (LazyOp(BinaryOps.MUL, tuple(LazyOp(UnaryOps.CAST, (s,), to) for s in mul.src)),), x.arg)
    return LazyOp(x.op, tuple(walk(s) for s in x.src), x.arg)
  return walk(ast)


def matmul_ast(m: int, n: int, k: int, dtype_in: Any, dtype_out: Any) -> LazyOp:
  """The one kernel of `A(m x k) @ B(k x n)` for dtype_in inputs and a dtype_out result, in the form tensor cores take."""
  from tiny import Tensor
  from tiny.backend import create_schedule
  a, b = Tensor.empty(m, k, dtype=dtype_in, device="PYTHON"), Tensor.empty(k, n, dtype=dtype_in, device="PYTHON")
  asts = [si.ast for si in create_schedule([a.matmul(b, acc_dtype=dtype_out).lazydata]) if si.ast.op is MetaOps.KERNEL]
  if len(asts) != 1:
    raise ValueError(f"a {dtype_in} -> {dtype_out} matmul made {len(asts)} kernels")
  return acc_inside_mul(asts[0])


# the tensor-core matmuls of the suite: (m, n, k, dtype in, dtype out)
TC_MATMULS = [(32, 32, 32, dtypes.float32, dtypes.float32), (64, 32, 48, dtypes.float16, dtypes.float32),
              (32, 48, 16, dtypes.float16, dtypes.float16), (32, 32, 64, dtypes.bfloat16, dtypes.float32),
              (16, 24, 32, dtypes.bfloat16, dtypes.bfloat16)]


def suite_programs(renderer: Any, opt: str, suite: Optional[Dict[str, List[LazyOp]]] = None) -> List[Any]:
  """Programs of every supported kernel of the suite under one style, named <case>_<i>_<opt> so that they can share one
  translation unit; opt "tc" gives the tensor-core matmuls of TC_MATMULS instead."""
  if opt == "tc":
    return [make_program(matmul_ast(m, n, k, di, do), renderer, "tc", f"tc_{m}_{n}_{k}_{di.name.strip('_')}_{do.name.strip('_')}")
            for m, n, k, di, do in TC_MATMULS]
  suite = suite_asts() if suite is None else suite
  return [make_program(ast, renderer, opt, f"{name}_{i}_{opt}") for name, asts in suite.items() if name not in UNSUPPORTED
          for i, ast in enumerate(asts)]


def main(argv: List[str]) -> int:
  """Render the suite in every style and syntax-check each style's kernels with one clang run."""
  from tiny_metal.renderer import MetalRenderer
  from tiny_metal.syntax import MSLSyntaxError, check_msl_batch, checker_missing
  if (why := checker_missing()) is not None:
    print(f"cannot check: {why}")
    return 2
  suite = suite_asts(argv or None)
  failed = 0
  for opt in (*OPT_STYLES, "tc"):
    st = time.perf_counter()
    progs = suite_programs(MetalRenderer(), opt, suite)
    try:
      check_msl_batch([p.src for p in progs], [p.name for p in progs])
      print(f"{opt}: {len(progs)} kernels pass the MSL syntax check ({time.perf_counter() - st:.2f}s)")
    except MSLSyntaxError as e:
      failed += 1
      print(f"{opt}: FAIL\n{e.compiler_msg}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
