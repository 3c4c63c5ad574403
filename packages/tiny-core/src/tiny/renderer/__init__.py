"""Renderers turn a linearized UOp list into program source for one device.

`Renderer` describes what a device can do (locals, shared memory, vector types, tensor cores, launch
limits); `Program` is what the kernel compiler hands to a device: the source plus everything needed to
launch it. The standard tensor-core descriptions of CUDA, AMD and Metal live here so that their device
packages and the PYTHON emulator share one definition.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

if TYPE_CHECKING:
  from tiny.codegen.uops import UOp
  from tiny.dtype import DType


def lazy_gated_alternatives(uops: Sequence[UOp]) -> Set[UOp]:
  """The per-lane fallbacks of gated vector loads: each such LOAD's VECTORIZE alternative and the lane LOADs in it, when
  used only there. A renderer emits them inside the load's fallback path, never ahead of it, so a lane is only read when
  the whole-vector gate is false and that lane's own gate is true."""
  from tiny.codegen.uops import UOps
  uses: Dict[UOp, int] = {}
  for u in uops:
    for x in u.src:
      uses[x] = uses.get(x, 0) + 1
  lazy: Set[UOp] = set()
  for u in uops:
    if u.op is UOps.LOAD and len(u.src) > 3 and u.dtype is not None and u.dtype.count > 1 and (alt := u.src[3]).op is UOps.VECTORIZE and \
        uses[alt] == 1 and all(x.op is UOps.LOAD and uses[x] == 1 for x in alt.src):
      lazy.add(alt)
      lazy.update(alt.src)
  return lazy


@dataclass(frozen=True)
class TensorCore:
  """One matrix-multiply-accumulate instruction: D = A @ B + C with A (M x K), B (K x N), C and D (M x N).

  `dims` is (N, M, K). `threads` lists the (tensor-core dim, amount) pairs whose product is the warp; the
  order says which bits of the lane id walk which dim. `thread_local_sizes` gives, for A, B and C, how many
  elements each thread keeps in registers per upcast level.
  """

  dims: Tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: List[Tuple[int, int]]
  thread_local_sizes: List[List[int]]

  def __str__(self) -> str:
    return "_".join(["WMMA", *map(str, self.dims), self.dtype_in.name, self.dtype_out.name])

  def num_upcasts(self) -> int:
    """How many upcast axes the tensor-core opt adds (the register tile of each operand is split this many times)."""
    return len(self.thread_local_sizes[0]) - 1

  def num_threads(self) -> int:
    """Threads that cooperate on one instruction (the warp/wave/simdgroup size)."""
    n = 1
    for _, amt in self.threads:
      n *= amt
    return n

  def elements_per_thread(self) -> Tuple[int, int, int]:
    """Register elements each thread holds for A, B and C."""
    def _p(xs: Sequence[int]) -> int:
      n = 1
      for x in xs:
        n *= x
      return n
    a, b, c = (_p(s) for s in self.thread_local_sizes)
    return a, b, c


def _pairs(dtype_pairs: Sequence[Tuple[str, str]]) -> List[Tuple[DType, DType]]:
  from tiny.dtype import dtypes
  return [(getattr(dtypes, i), getattr(dtypes, o)) for i, o in dtype_pairs]


def cuda_tensor_cores() -> List[TensorCore]:
  """mma.sync m16n8k16 (sm_80+): 32 threads, half/bfloat16 in, float out."""
  return [TensorCore(dims=(8, 16, 16), threads=[(0, 2), (0, 2), (1, 2), (1, 2), (1, 2)], thread_local_sizes=[[2, 2, 2], [2, 2], [2, 2]],
                     dtype_in=di, dtype_out=do) for di, do in _pairs([("half", "float"), ("bfloat16", "float")])]


def amd_tensor_cores() -> List[TensorCore]:
  """RDNA3 WMMA 16x16x16 in wave32: half in, float or half out."""
  return [TensorCore(dims=(16, 16, 16), threads=[(0, 8), (0, 2), (1, 2)], thread_local_sizes=[[16], [16], [4, 2]],
                     dtype_in=di, dtype_out=do) for di, do in _pairs([("half", "float"), ("half", "half")])]


def metal_tensor_cores() -> List[TensorCore]:
  """simdgroup_matrix 8x8x8 on a 32-thread simdgroup."""
  return [TensorCore(dims=(8, 8, 8), threads=[(0, 2), (1, 4), (0, 2), (1, 2)], thread_local_sizes=[[2], [2], [2]],
                     dtype_in=di, dtype_out=do) for di, do in _pairs([("float", "float"), ("half", "float"), ("half", "half")])]


def _module_getattr(name: str) -> Any:
  # the lists are built on first use so that importing tiny.renderer does not need tiny.dtype yet
  makers: Dict[str, Callable[[], List[TensorCore]]] = {"CUDA_TENSOR_CORES": cuda_tensor_cores, "AMD_TENSOR_CORES": amd_tensor_cores,
                                                       "METAL_TENSOR_CORES": metal_tensor_cores}
  if name in makers:
    val = makers[name]()
    globals()[name] = val
    return val
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__getattr__ = _module_getattr


def _uop_list(uops: Any) -> List[UOp]:
  """Accept a plain list of UOps or anything iterable over them (a linearized UOpGraph)."""
  return list(uops) if uops is not None else []


@dataclass(frozen=True)
class Program:
  """A rendered kernel: source, device name, launch sizes (may be symbolic), the uops it came from and cost estimates."""

  name: str
  src: str
  dname: str
  global_size: Optional[List[Any]] = None
  local_size: Optional[List[Any]] = None
  uops: Optional[Any] = None
  op_estimate: Any = 0
  mem_estimate: Any = 0
  _vars: List[Any] = field(default_factory=list, init=False, repr=False, compare=False)
  _globals: List[int] = field(default_factory=list, init=False, repr=False, compare=False)
  _outs: List[int] = field(default_factory=list, init=False, repr=False, compare=False)

  def __post_init__(self) -> None:
    gvars, gbufs, outs = [], [], []
    gsz = list(self.global_size) if self.global_size is not None else None
    lsz = list(self.local_size) if self.local_size is not None else None
    uops = _uop_list(self.uops)
    if uops:
      from tiny.codegen.uops import UOps
    for u in uops:
      if u.op is UOps.DEFINE_VAR:
        gvars.append(u.arg)
      elif u.op is UOps.DEFINE_GLOBAL:
        gbufs.append(u.arg[0])
      elif u.op is UOps.STORE and u.src[0].op is UOps.DEFINE_GLOBAL:
        outs.append(u.src[0].arg[0])
      elif u.op is UOps.SPECIAL:
        # the SPECIAL uops are the authority on launch sizes; sizes passed in are only the [1,1,1] base
        dim, name, size = u.arg
        if name.startswith("lidx") and lsz is not None:
          lsz[dim] = size
        elif name.startswith("gidx") and gsz is not None:
          gsz[dim] = size
        elif name.startswith("idx"):
          if gsz is not None:
            gsz[dim] = size
          lsz = None
    object.__setattr__(self, "global_size", gsz)
    object.__setattr__(self, "local_size", lsz)
    object.__setattr__(self, "_vars", sorted(dict.fromkeys(gvars), key=_var_key))
    object.__setattr__(self, "_globals", sorted(set(gbufs)))
    object.__setattr__(self, "_outs", sorted(set(outs)))

  @property
  def vars(self) -> List[Any]:
    """The symbolic Variables the kernel takes as arguments, in argument order."""
    return list(self._vars)

  @property
  def globals(self) -> List[int]:
    """Buffer indices of the kernel's global buffer arguments."""
    return list(self._globals)

  @property
  def outs(self) -> List[int]:
    """Buffer indices the kernel writes to."""
    return list(self._outs)

  def launch_dims(self, var_vals: Mapping[Any, int]) -> Tuple[List[int], Optional[List[int]]]:
    """Evaluate the (possibly symbolic) global and local sizes with the given variable values."""
    return _infer_dims(self.global_size, var_vals) or [1, 1, 1], _infer_dims(self.local_size, var_vals)


def _var_key(v: Any) -> str:
  return str(getattr(v, "expr", v))


def _infer_dims(dims: Optional[Sequence[Any]], var_vals: Mapping[Any, int]) -> Optional[List[int]]:
  if dims is None:
    return None
  out: List[int] = []
  for d in dims:
    if isinstance(d, int):
      out.append(d)
    else:
      from tiny.shape.symbolic import sym_infer
      out.append(int(sym_infer(d, var_vals)))
  return out


class Renderer:
  """What a device's code generator can do, and how it turns a linearized UOp list into source."""

  device: str = ""
  suffix: str = ""
  # TODO: make this generic with a list of supported vector sizes
  supports_float4: bool = True
  # widest SIMD register in bytes: > 0 makes the codegen fold loads/stores that wide and re-pack scalar lanes into vector ALU ops
  simd_bytes: int = 0
  has_local: bool = True
  has_shared: bool = True
  # SPECIAL indices are int32, so the launch grid stays below 2**31 per dim
  global_max: Optional[Tuple[int, ...]] = (0x8FFFFFFF,) * 3
  local_max: Optional[Tuple[int, ...]] = (0x8FFFFFFF,) * 3
  shared_max: int = 32768
  tensor_cores: List[TensorCore] = []
  extra_matcher: Any = None
  code_for_op: Dict[Any, Callable] = {}

  def cache_key(self) -> Tuple[Any, ...]:
    """What decides the code this renderer writes: its class and its settings (arch, vector width, ...).

    Compiled programs are cached under it, so two renderers of one device (CUDA and CUDA:PTX) or one renderer with
    two archs never share a program. A renderer whose output depends on more than its plain attributes overrides it."""
    plain = (str, int, float, bool, type(None))
    attrs = tuple(sorted((k, v) for k, v in vars(self).items()
                         if isinstance(v, plain) or (isinstance(v, tuple) and all(isinstance(x, plain) for x in v))))
    return (type(self).__module__, type(self).__qualname__, self.device, self.suffix, self.simd_bytes, attrs)

  def render(self, name: str, uops: List[UOp]) -> str:
    """Source code for the kernel `name` from its linearized uops."""
    raise NotImplementedError(f"{type(self).__name__} does not implement render")
