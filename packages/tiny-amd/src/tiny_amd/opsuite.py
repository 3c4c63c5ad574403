"""A representative suite of kernels for checking the AMD renderer and compiler without a GPU.

`op_suite_asts()` builds kernels the way a program does (Tensor ops -> schedule) on the PYTHON device, so the ASTs are
what the scheduler produces; `render_suite()` turns each into a Program for a renderer. `batch_source()` puts many
rendered kernels in one HIP translation unit, so one clang run checks them all.
`python -m tiny_amd.opsuite [gfx1100 gfx90a ...]` renders and compiles the whole suite, one kernel at a time.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from tiny.backend import BinaryOps, Kernel, KernelOptError, LazyOp, MetaOps, ReduceOps, UnaryOps, dtypes

SuiteCase = Tuple[str, Callable[[], Any]]


def _cases() -> List[SuiteCase]:
  from tiny import Tensor, Variable   # the user API: the suite builds kernels the way a program does

  def t(*shape: int, dtype: Any = dtypes.float32) -> Any:
    return Tensor.empty(*shape, dtype=dtype, device="PYTHON")

  a, b = t(4, 33), t(4, 33)
  n = Variable("n", 1, 64)
  return [
    # elementwise float32
    ("add", lambda: a + b), ("mul_sub_div", lambda: (a * b - 2.0) / (b + 3.0)), ("neg_abs_max", lambda: (-a).abs().maximum(b)),
    ("exp_log", lambda: a.exp() + a.exp2() + b.log()), ("sin_sqrt", lambda: a.sin() * b.sqrt()), ("sigmoid_tanh", lambda: a.sigmoid() + b.tanh()),
    ("gelu_relu", lambda: a.gelu() + b.relu()), ("where_cmp", lambda: (a < b).where(a, b) + (a == 1.0).where(1.0, 0.0)),
    ("float4_vec", lambda: t(64, 64) * 2.0 + t(64, 64)),
    # reductions
    ("reduce_sum", lambda: t(64, 96).sum(axis=1)), ("reduce_max", lambda: t(96, 64).max(axis=0)), ("reduce_all", lambda: t(1024).sum()),
    ("mean_var", lambda: t(16, 64).var(axis=1)), ("softmax", lambda: t(8, 100).softmax()), ("argmax", lambda: t(8, 40).argmax(axis=1)),
    ("layernorm", lambda: t(8, 64).layernorm()), ("cumsum", lambda: t(50).cumsum()), ("arange", lambda: Tensor.arange(100, device="PYTHON") * 3),
    # contractions and movement
    ("matmul", lambda: t(64, 64) @ t(64, 64)), ("matvec", lambda: t(256, 128) @ t(128)),
    ("conv2d", lambda: t(1, 4, 12, 12).conv2d(t(8, 4, 3, 3))), ("max_pool", lambda: t(1, 2, 8, 8).max_pool2d()),
    ("pad_shrink", lambda: t(6, 6).pad(((1, 2), (0, 3))).shrink(((0, 7), (1, 8))) + 1.0), ("permute", lambda: t(16, 8).permute(1, 0).contiguous()),
    ("one_hot", lambda: t(10, dtype=dtypes.int32).one_hot(7)),
    # integers, other floats, casts
    ("int_ops", lambda: (t(64, dtype=dtypes.int32) // 3) * 7 + t(64, dtype=dtypes.int32) % 5),
    ("bitwise", lambda: (t(64, dtype=dtypes.int32) ^ t(64, dtype=dtypes.int32)) & 0xFF | 3),
    ("int64_uint8", lambda: t(64, dtype=dtypes.int64) * 3 + t(64, dtype=dtypes.uint8).cast(dtypes.int64)),
    ("float64", lambda: (t(32, dtype=dtypes.float64) * 1.5).exp() + t(32, dtype=dtypes.float64).exp2() + t(32, dtype=dtypes.float64).sin()),
    ("rand", lambda: Tensor.rand(37, device="PYTHON")),
    ("half_ew", lambda: (t(64, dtype=dtypes.half) * 2 + t(64, dtype=dtypes.half)).relu().sqrt() + t(64, dtype=dtypes.half).sin()),
    ("half_reduce", lambda: t(32, 64, dtype=dtypes.half).sum(axis=1, acc_dtype=dtypes.float32)),
    ("bf16_ew", lambda: (t(64, dtype=dtypes.bfloat16) * 2 + t(64, dtype=dtypes.bfloat16)).exp() + t(64, dtype=dtypes.bfloat16).exp2()),
    ("casts", lambda: t(64).cast(dtypes.half).cast(dtypes.int8).cast(dtypes.bfloat16).cast(dtypes.float32) +
     t(64, dtype=dtypes.bool).cast(dtypes.float32)),
    ("bitcast", lambda: t(64).bitcast(dtypes.int32) + 1),
    ("half_matmul", lambda: t(64, 64, dtype=dtypes.half).matmul(t(64, 64, dtype=dtypes.half), acc_dtype=dtypes.float32)),
    ("bf16_matmul", lambda: t(64, 64, dtype=dtypes.bfloat16).matmul(t(64, 64, dtype=dtypes.bfloat16), acc_dtype=dtypes.float32)),
    # symbolic shapes
    ("symbolic", lambda: (t(64, 32).shrink(((0, n.bind(20)), None)) * 2).sum(axis=1)),
    ("symbolic_reduce", lambda: (t(64, 32).shrink(((0, n.bind(20)), None)) * 2).sum(axis=0)),
  ]


def case_names() -> List[str]:
  """The names of the suite's cases, in order."""
  return [name for name, _ in _cases()]


def op_suite_schedule(names: Optional[List[str]] = None) -> Dict[str, List[Any]]:
  """{case name: the kernel ScheduleItems of its schedule} (each with the AST and the buffers it reads and writes)."""
  from tiny.backend import create_schedule_with_vars
  out: Dict[str, List[Any]] = {}
  for name, fn in _cases():
    if names is None or name in names:
      sched, _ = create_schedule_with_vars([fn().lazydata])
      out[name] = [si for si in sched if si.ast.op is MetaOps.KERNEL]
  return out


def op_suite_asts(names: Optional[List[str]] = None) -> Dict[str, List[LazyOp]]:
  """{case name: the kernel ASTs its schedule holds} for the suite (or the named cases)."""
  return {name: [si.ast for si in items] for name, items in op_suite_schedule(names).items()}


def cast_inside_mul(ast: LazyOp) -> LazyOp:
  """SUM(CAST(MUL(a, b))) -> SUM(MUL(CAST(a), CAST(b))): `a.matmul(b, acc_dtype=...)` multiplies in the input dtype and
  casts the product, a form core's tensor-core opt does not match; this is the form it does."""
  if ast.op is ReduceOps.SUM and ast.src[0].op is UnaryOps.CAST and ast.src[0].src[0].op is BinaryOps.MUL:
    to, mul = ast.src[0].arg, ast.src[0].src[0]
    return LazyOp(ast.op, (LazyOp(BinaryOps.MUL, tuple(LazyOp(UnaryOps.CAST, (s,), to) for s in mul.src)),), ast.arg)
  return LazyOp(ast.op, tuple(cast_inside_mul(s) for s in ast.src), ast.arg)


def tc_matmul_ast(m: int, n: int, k: int, dtype_out: Any = dtypes.float32) -> LazyOp:
  """The kernel of `A(m x k) @ B(k x n)` with half inputs and a dtype_out result, in the tensor-core form."""
  from tiny import Tensor
  from tiny.backend import create_schedule
  a, b = Tensor.empty(m, k, dtype=dtypes.half, device="PYTHON"), Tensor.empty(k, n, dtype=dtypes.half, device="PYTHON")
  out = a.matmul(b, acc_dtype=dtype_out)
  asts = [si.ast for si in create_schedule([out.lazydata]) if si.ast.op is MetaOps.KERNEL]
  if len(asts) != 1:
    raise RuntimeError(f"a matmul should be one kernel, got {len(asts)}")
  return cast_inside_mul(asts[0])


def make_program(ast: LazyOp, renderer: Any, opt: str = "hand", name: Optional[str] = None) -> Any:
  """The Program of one AST; opt is "none", "hand" (hand_coded_optimizations) or "tc" (tensor cores first)."""
  k = Kernel(ast, opts=renderer)
  if opt == "hand":
    k.hand_coded_optimizations()
  elif opt == "tc":
    if not k.apply_tensor_cores(1):
      raise KernelOptError("no tensor core applies to this kernel")
  elif opt != "none":
    raise ValueError(f"opt must be none, hand or tc, not {opt!r}")
  return k.to_program(name_override=name) if name is not None else k.to_program()


def render_suite(renderer: Any, opt: str = "hand", suite: Optional[Dict[str, List[LazyOp]]] = None) -> List[Any]:
  """Programs of every kernel of the suite, named <case>_<i> so that they can share one code object."""
  suite = op_suite_asts() if suite is None else suite
  return [make_program(ast, renderer, opt, f"{name}_{i}") for name, asts in suite.items() for i, ast in enumerate(asts)]


def batch_source(srcs: List[str]) -> str:
  """One HIP translation unit holding many rendered kernels (with distinct names): the `#define`s are hoisted, the rest of
  kernel i goes in `namespace k<i>` so one kernel's typedefs and helpers never clash with another's (`extern "C"` keeps the
  kernel names plain). One clang run then checks them all: its start-up dominates the time of a small kernel."""
  defines = list(dict.fromkeys(ln for src in srcs for ln in src.splitlines() if ln.startswith("#")))
  bodies = [f"namespace k{i} {{\n" + "\n".join(ln for ln in src.splitlines() if not ln.startswith("#")) + "\n}" for i, src in enumerate(srcs)]
  return "\n".join(defines + bodies) + "\n"


def main(argv: List[str]) -> int:
  """Render and compile the suite for each architecture given (default gfx1100 gfx90a), one kernel at a time."""
  from tiny_amd.codeobject import code_object_arch, kernel_names
  from tiny_amd.compiler import HIPCompiler
  from tiny_amd.renderer import HIPRenderer
  suite = op_suite_asts()
  failed = 0
  for arch in argv or ["gfx1100", "gfx90a"]:
    renderer, compiler = HIPRenderer(arch), HIPCompiler(arch)
    st, n = time.perf_counter(), 0
    for opt in ("none", "hand"):
      for prg in render_suite(renderer, opt, suite):
        try:
          lib = compiler.compile(prg.src)
          if code_object_arch(lib) != arch or kernel_names(lib) != [prg.name]:
            raise RuntimeError(f"code object for {code_object_arch(lib)} with kernels {kernel_names(lib)}")
          n += 1
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
          failed += 1
          print(f"FAIL {arch} {prg.name} {opt}: {type(e).__name__}: {str(e)[:2000]}")
    print(f"{arch}: {n} kernels compiled one by one in {time.perf_counter() - st:.2f}s")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
