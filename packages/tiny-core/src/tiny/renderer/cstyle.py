"""`CStyleLanguage`: the shared walk that turns a linearized UOp list into C-family source.

C, OpenCL, CUDA, HIP and Metal differ in a handful of spellings (kernel prefix, argument qualifiers, how a
thread finds its index, vector constructors, barriers, builtin names). Each of those is an attribute or a
small method here, so a device renderer is a subclass that overrides only what its language spells
differently; the walk over the uops is written once.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, Callable, DefaultDict, Dict, List, Optional, Set, Tuple, cast

from tiny.dtype import DType, PtrDType, dtypes
from tiny.codegen.uops import UOp, UOps
from tiny.helpers import strip_parens
from tiny.ops import BinaryOps, TernaryOps, UnaryOps
from tiny.renderer import Renderer, lazy_gated_alternatives
from tiny.renderer.int_wrap import UNSIGNED_OF, wrapping_int_ops


_NARROW_INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)


class RenderError(RuntimeError):
  """The uop list holds something this renderer cannot express."""


def _is_float(dt: DType) -> bool:
  return dtypes.is_float(dt)


def _scalar(dt: DType) -> DType:
  return dt.scalar() if dt.count > 1 else dt


def _base(dt: DType) -> DType:
  """The element dtype of a pointer dtype (a plain dtype is returned as is)."""
  base = getattr(dt, "base", None)
  return base if base is not None else dt


def _offset(idx: str) -> str:
  """idx as the right operand of `ptr+`: loads and stores get it with its outer parentheses stripped, which is only safe
  for operators that bind tighter than + (a data-dependent index may be a ternary or a bitwise and)."""
  return f"({idx})" if any(c in idx for c in "?&|^<>=!") else idx


class CStyleLanguage(Renderer):
  """Renders linearized uops as a C-like kernel; subclasses set the spellings of their language."""

  kernel_prefix: str = ""  # before `void name(...)`, e.g. `extern "C" __global__ `
  buffer_prefix: str = ""  # before the element type of a global pointer argument, e.g. `__global `
  buffer_suffix: str = ""  # after the `*` of a pointer argument, e.g. ` restrict`
  smem_align: str = ""  # before a shared-memory declaration, e.g. `__attribute__ ((aligned (16))) `
  smem_prefix: str = ""  # storage qualifier of shared memory, e.g. `__shared__ `
  smem_prefix_for_cast: bool = True  # whether pointer casts into shared memory repeat smem_prefix
  arg_int_prefix: str = "const int"  # type of a symbolic-variable argument
  barrier: str = ""  # statement that synchronises a workgroup
  code_for_workitem: Dict[str, Callable[[int], str]] = {}  # "g" global, "l" local, "i" global*local -> fn(dim) -> expression
  extra_args: List[str] = []  # appended to the argument list (e.g. Metal's thread-position arguments)
  float4: Optional[str] = None  # vector constructor template, written for `float4`, e.g. `(float4)` or `make_float4`
  uses_vload: bool = False  # half buffers read/written with vload_half/vstore_half (OpenCL)
  uses_ptr_arithmetic: bool = False  # `*(buf+idx)` instead of `buf[idx]`
  type_map: Dict[Any, str] = {}  # dtype -> spelling, when it differs from dtype.name
  infinity: str = "INFINITY"
  nan: str = "NAN"
  # ops whose spelling uses an operand twice (macros); their results always get a variable so expressions stay linear
  ssa_ops: Set[Any] = {BinaryOps.MAX}

  code_for_op: Dict[Any, Callable] = {
    UnaryOps.NEG: lambda x, dtype: f"(!{x})" if _is_bool(dtype) else f"(-{x})",
    UnaryOps.SQRT: lambda x, dtype: f"sqrt({x})",
    UnaryOps.RECIP: lambda x, dtype: f"(1/{x})",
    UnaryOps.EXP2: lambda x, dtype: f"exp2({x})",
    UnaryOps.LOG2: lambda x, dtype: f"log2({x})",
    UnaryOps.SIN: lambda x, dtype: f"sin({x})",
    BinaryOps.ADD: lambda a, b, dtype: f"({a}+{b})",
    BinaryOps.MUL: lambda a, b, dtype: f"({a}*{b})",
    BinaryOps.IDIV: lambda a, b, dtype: f"({a}/{b})",
    BinaryOps.MOD: lambda a, b, dtype: f"({a}%{b})",
    BinaryOps.MAX: lambda a, b, dtype: f"max({a},{b})",
    BinaryOps.CMPLT: lambda a, b, dtype: f"({a}<{b})",
    BinaryOps.CMPNE: lambda a, b, dtype: f"({a}!={b})",
    BinaryOps.XOR: lambda a, b, dtype: f"({a}^{b})",
    BinaryOps.AND: lambda a, b, dtype: f"({a}&{b})",
    BinaryOps.OR: lambda a, b, dtype: f"({a}|{b})",
    BinaryOps.SHL: lambda a, b, dtype: f"({a}<<{b})",
    BinaryOps.SHR: lambda a, b, dtype: f"({a}>>{b})",
    TernaryOps.MULACC: lambda a, b, c, dtype: f"(({a}*{b})+{c})",
    TernaryOps.WHERE: lambda a, b, c, dtype: f"({a}?{b}:{c})",
  }

  # *** spellings a subclass may override ***

  def render_dtype(self, var_dtype: DType) -> str:
    """The language's name for a (scalar or vector) dtype; pointer dtypes render as their element type."""
    dt = _base(var_dtype)
    if dt in self.type_map:
      return self.type_map[dt]
    if dt.count > 1:
      return self.render_vector_dtype(_scalar(dt), dt.count)
    return dt.name

  def render_vector_dtype(self, scalar: DType, count: int) -> str:
    """Name of the vector type with `count` lanes of `scalar` (OpenCL/CUDA style `float4` by default)."""
    return f"{self.type_map.get(scalar, scalar.name).replace(' ', '')}{count}"

  def render_cast(self, x: List[str], var_dtype: DType, bitcast: bool = False) -> str:
    """Expression converting x to var_dtype; several x build a vector (VECTORIZE); bitcast reinterprets the bits."""
    if bitcast:
      return f"(*(({self.buffer_prefix}{self.render_dtype(var_dtype)}*)&{x[0]}))"
    if len(x) == 1:
      return f"({self.render_dtype(var_dtype)})({x[0]})"
    if len(x) != var_dtype.count:
      raise RenderError(f"vector of {len(x)} elements does not fit {var_dtype}")
    return self.render_vectorize(x, var_dtype)

  def render_vectorize(self, x: List[str], var_dtype: DType) -> str:
    """Expression building a vector from its elements."""
    if self.float4 is None:
      raise RenderError(f"{type(self).__name__} has no vector types, cannot build {var_dtype}")
    return f"{self.float4.replace('float4', self.render_dtype(var_dtype))}({','.join(x)})"

  def render_const(self, x: Any, dtype: DType) -> str:
    """Literal for the scalar value x in dtype; a vector dtype broadcasts x to every lane."""
    scalar = _scalar(dtype)
    if _is_float(scalar) and math.isnan(x):
      val = self.nan
    elif _is_float(scalar) and math.isinf(x):
      val = ("-" if x < 0 else "") + self.infinity
    elif scalar == dtypes.bool:
      val = "1" if x else "0"
    elif _is_float(scalar):
      val = repr(float(x)) + ("f" if scalar == dtypes.float32 else "")
    elif scalar == dtypes.int32 and int(x) == -2**31:
      val = "(-2147483647-1)"
    elif scalar == dtypes.uint32:
      val = f"{int(x)}u"
    elif scalar == dtypes.int64:
      val = f"{int(x)}ll" if int(x) != -2**63 else "(-9223372036854775807ll-1)"
    elif scalar == dtypes.uint64:
      val = f"{int(x)}ull"
    else:
      val = str(int(x))
    if dtype.count > 1:
      return self.render_cast([val] * dtype.count, dtype)
    if scalar in (dtypes.float32, dtypes.int32, dtypes.bool, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float64) and val[0] != "-":
      return val
    if scalar in (dtypes.float32, dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64, dtypes.float64):
      return f"({val})"
    return self.render_cast([val], scalar)

  def render_load(self, output_dtype: DType, buf_name: str, buf_dtype: DType, idx: str, local: bool = False) -> str:
    """Expression reading output_dtype (a vector reads that many consecutive elements) at buf_name[idx]."""
    elem = _base(buf_dtype)
    if self.uses_vload and _scalar(elem) == dtypes.float16 and _scalar(output_dtype) != dtypes.float16:
      return f"vload_half{'' if output_dtype.count == 1 else str(output_dtype.count)}(0, {buf_name}+{_offset(idx)})"
    if output_dtype.count > 1:
      prefix = self.smem_prefix if local and self.smem_prefix_for_cast else self.buffer_prefix
      return f"(*(({prefix}{self.render_dtype(output_dtype)}*)({buf_name}+{_offset(idx)})))"
    return f"(*({buf_name}+{_offset(idx)}))" if self.uses_ptr_arithmetic else f"{buf_name}[{idx}]"

  def render_alu(self, u: UOp, operands: List[str]) -> str:
    """The C expression of ALU uop u on its rendered operands (a language may spell some uops differently)."""
    return self.code_for_op[u.arg](*operands, u.dtype)

  def render_wrapping_alu(self, u: UOp, operands: List[str]) -> str:
    """ALU uop u on signed int32/int64 data, computed in the unsigned type of its width so that overflow wraps as
    numpy's does (signed overflow is undefined in C-family languages); converting back wraps on every target."""
    dtype = cast(DType, u.dtype)
    t, ut = self.render_dtype(dtype), self.render_dtype(UNSIGNED_OF[dtype])
    xs = [f"(({ut})({x}))" for x in operands]
    if u.arg is UnaryOps.NEG:
      return f"(({t})((({ut})0)-{xs[0]}))"
    if u.arg is TernaryOps.MULACC:
      return f"(({t})({xs[0]}*{xs[1]}+{xs[2]}))"
    return f"(({t})({xs[0]}{'+' if u.arg is BinaryOps.ADD else '*'}{xs[1]}))"

  def render_store(self, buf_name: str, buf_dtype: DType, var_name: str, var_dtype: DType, idx: str, local: bool = False) -> str:
    """Statement writing var_name (scalar or vector) to buf_name at idx."""
    elem = _base(buf_dtype)
    if self.uses_vload and _scalar(elem) == dtypes.float16 and _scalar(var_dtype) != dtypes.float16:
      return f"vstore_half{'' if var_dtype.count == 1 else str(var_dtype.count)}({var_name}, 0, {buf_name}+{_offset(idx)});"
    if var_dtype.count > 1:
      prefix = self.smem_prefix if local and self.smem_prefix_for_cast else self.buffer_prefix
      return f"*(({prefix}{self.render_dtype(var_dtype)}*)({buf_name}+{_offset(idx)})) = {var_name};"
    return f"*({buf_name}+{_offset(idx)}) = {var_name};" if self.uses_ptr_arithmetic else f"{buf_name}[{idx}] = {var_name};"

  def render_local(self, name: str, dtype: DType, size: int) -> str:
    """Declaration of a shared-memory array."""
    return f"{self.smem_align}{self.smem_prefix}{self.render_dtype(dtype)} {name}[{size}];"

  def render_gep(self, vec: str, idx: int, vec_dtype: DType) -> str:
    """Expression for lane idx of the vector variable vec."""
    return f"{vec}.{'xyzw'[idx]}" if vec_dtype.count <= 4 else f"{vec}[{idx}]"

  def render_wmma(self, u: UOp, a: str, b: str, c: str) -> str:
    """Expression of a tensor-core op: a call to the `__WMMA_...` helper the subclass puts in its prefix."""
    return f"__{u.arg[0]}({a}, {b}, {c})"

  def render_special(self, name: str, dim: int, size: int) -> str:
    """Statement declaring a thread index: name is gidx/lidx/idx followed by the dim."""
    if name[0] not in self.code_for_workitem:
      raise RenderError(f"{type(self).__name__} has no thread index for {name}")
    return f"int {name} = {self.code_for_workitem[name[0]](dim)}; /* {size} */"

  def render_arg(self, name: str, dtype: DType, mutable: bool, is_buffer: bool) -> str:
    """One kernel parameter: a global buffer pointer or a symbolic int."""
    if is_buffer:
      return f"{'' if mutable else 'const '}{self.buffer_prefix}{self.render_dtype(dtype)}*{self.buffer_suffix} {name}"
    return f"{self.arg_int_prefix} {name}"

  def get_kernel_modifier(self, uops: List[UOp]) -> str:
    """Text between `void` and the function name (launch bounds and the like)."""
    return ""

  def render_kernel(self, function_name: str, kernel: List[str], bufs: List[Tuple[str, Tuple[DType, bool]]], uops: List[UOp],
                    prefix: Optional[List[str]] = None) -> str:
    """Wrap the body lines in the function definition; bufs are (name, (dtype, mutable)) in argument order."""
    args = [self.render_arg(name, dtype, mutable, _is_ptr(dtype)) for name, (dtype, mutable) in bufs] + list(self.extra_args)
    prg = f"{self.kernel_prefix}void {self.get_kernel_modifier(uops)}{function_name}({', '.join(args)}) {{\n" + "\n".join(kernel) + "\n}"
    return prg if prefix is None else "\n".join(prefix) + f"\n{prg}"

  # *** the walk ***

  def render(self, name: str, uops: List[UOp]) -> str:  # noqa: C901
    """C-family source of the kernel `name` from its linearized uops."""
    uops = list(uops)
    kernel: List[str] = []
    bufs: Dict[int, Tuple[str, Tuple[Any, bool]]] = {}
    var_args: Dict[str, Tuple[str, Tuple[Any, bool]]] = {}
    depth = 1
    counters: DefaultDict[str, int] = defaultdict(int)
    r: Dict[UOp, str] = {}
    uses = Counter(s for u in uops for s in u.src)
    mutable: Set[UOp] = set()  # accumulators: expressions reading them must not be moved past a PHI
    # a gated vector load's alternative (a VECTORIZE of per-lane gated loads) is written inline, inside the ternary
    lazy = lazy_gated_alternatives(uops)
    wrapping = wrapping_int_ops(uops)

    def emit(line: str) -> None:
      kernel.append("  " * depth + line)

    def ssa(prefix: str, u: Optional[UOp] = None) -> str:
      ret = f"{prefix}{counters[prefix]}"
      counters[prefix] += 1
      if u is not None:
        r[u] = ret
      return ret

    def bind(u: UOp, prefix: str, val: str, inline: bool) -> None:
      if inline:
        r[u] = val
      else:
        emit(f"{self.render_dtype(cast('DType', u.dtype))} {ssa(prefix, u)} = {val};")

    for u in uops:
      op, src, arg = u.op, u.src, u.arg
      dtype: Any = u.dtype  # None only for the statement uops, which never read it
      if op in (UOps.SINK, UOps.NOOP, UOps.AFTER) and dtype is None:
        continue
      if op is UOps.IF:
        emit(f"if ({strip_parens(r[src[0]])}) {{")
        depth += 1
      elif op is UOps.BARRIER:
        emit(self.barrier)
      elif op in (UOps.ENDRANGE, UOps.ENDIF):
        depth -= 1
        emit("}")
      elif op is UOps.STORE:
        st = self.render_store(r[src[0]], cast("DType", src[0].dtype), r[src[2]], cast("DType", src[2].dtype), strip_parens(r[src[1]]),
                               src[0].op is UOps.DEFINE_LOCAL)
        emit(f"if ({strip_parens(r[src[3]])}) {{ {st} }}" if len(src) > 3 else st)
      elif op is UOps.RANGE:
        idx = ssa("ridx", u)
        emit(f"for ({self.render_dtype(dtype)} {idx} = {r[src[0]]}; {idx} < {r[src[1]]}; {idx}++) {{")
        depth += 1
      elif op is UOps.ALU:
        if arg in (BinaryOps.ADD, BinaryOps.MUL, BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR):
          # the same associative op nested in itself needs no parentheses
          operands = [strip_parens(r[s]) if s.op is UOps.ALU and s.arg is arg and s.dtype == dtype else r[s] for s in src]
        else:
          operands = [r[s] for s in src]
        if arg not in self.code_for_op:
          raise RenderError(f"{type(self).__name__} cannot render {arg}")
        val = self.render_wrapping_alu(u, operands) if u in wrapping else self.render_alu(u, operands)
        if dtype in _NARROW_INTS:
          # C computes narrow ints as int: truncate to the dtype, or the wider value leaks into the next inlined op
          val = f"(({self.render_dtype(dtype)})({strip_parens(val)}))"
        inline = uses[u] <= 1 and arg not in self.ssa_ops and dtype.count == 1 and not any(s in mutable for s in src)
        bind(u, "alu", val, inline)
      elif op is UOps.SPECIAL:
        emit(self.render_special(arg[1], arg[0], arg[2]))
        r[u] = arg[1]
      elif op is UOps.LOAD:
        val = self.render_load(dtype, r[src[0]], cast("DType", src[0].dtype), strip_parens(r[src[1]]), src[0].op is UOps.DEFINE_LOCAL)
        if len(src) > 3 and src[2].op is not UOps.BARRIER:
          # the ternary only evaluates the load when the gate is true, so out-of-bounds indices are never read
          if dtype.count > 1 and cast("DType", src[2].dtype).count == 1:
            val = f"({r[src[2]]}?{val}:{r[src[3]]})"   # one gate for a whole vector
          else:
            val = self.code_for_op[TernaryOps.WHERE](r[src[2]], val, r[src[3]], dtype)
        bind(u, "val", val, u in lazy)
      elif op is UOps.PHI:
        emit(f"{r[src[0]]} = {strip_parens(r[src[1]])};")
        r[u] = r[src[0]]
        mutable.add(u)
      elif op is UOps.BITCAST:
        pre = ssa("precast")
        emit(f"{self.render_dtype(cast('DType', src[0].dtype))} {pre} = {r[src[0]]};")
        bind(u, "cast", self.render_cast([pre], dtype, bitcast=True), False)
      elif op in (UOps.CAST, UOps.VECTORIZE):
        val = self.render_cast([r[s] for s in src], dtype)
        bind(u, "cast", val, u in lazy or (uses[u] <= 1 and dtype.count == 1 and not any(s in mutable for s in src)))
      elif op is UOps.DEFINE_LOCAL:
        emit(self.render_local(arg[0], _base(dtype), arg[1]))
        r[u] = arg[0]
      elif op is UOps.DEFINE_VAR:
        vname = arg.expr
        if vname in var_args:
          raise RenderError(f"variable {vname} is defined twice")
        var_args[vname] = (vname, (dtype, False))
        r[u] = vname
      elif op is UOps.DEFINE_GLOBAL:
        r[u] = f"data{arg[0]}"
        bufs[arg[0]] = (r[u], (dtype, bool(arg[1])))
      elif op is UOps.WMMA:
        bind(u, "wmma", self.render_wmma(u, r[src[0]], r[src[1]], r[src[2]]), False)
      elif op is UOps.DEFINE_ACC:
        bind(u, "acc", self.render_const(src[0].arg, dtype), False)
        mutable.add(u)
      elif op is UOps.CONST:
        r[u] = self.render_const(arg, dtype)
      elif op is UOps.GEP:
        base = r[src[0]]
        if not base.isidentifier():
          base = ssa("vec")
          emit(f"{self.render_dtype(cast('DType', src[0].dtype))} {base} = {r[src[0]]};")
        r[u] = self.render_gep(base, arg, cast("DType", src[0].dtype))
        if src[0] in mutable:
          mutable.add(u)
      else:
        raise RenderError(f"{type(self).__name__} cannot render {op}")

    # buffers in index order, then the symbolic variables sorted by name: the order Program.globals/.vars promise
    args = [bufs[i] for i in sorted(bufs)] + [var_args[k] for k in sorted(var_args)]
    return self.render_kernel(name, kernel, args, uops)


def _is_bool(dt: DType) -> bool:
  return _scalar(dt) == dtypes.bool


def _is_ptr(dt: DType) -> bool:
  return isinstance(dt, PtrDType)
