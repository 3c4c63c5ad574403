"""Renderers turn a linearized UOp list into program source for one device.

`Renderer` describes what a device can do (locals, shared memory, vector types, tensor cores, launch
limits); `Program` is what the kernel compiler hands to a device: the source plus everything needed to
launch it. `TensorCore` (with its `RegisterLayout`s) is how a device declares its matrix instructions; the definitions
themselves live with the devices that own them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from tiny.codegen.uops import UOp, UOps
from tiny.dtype import DType
from tiny.shape.symbolic import sym_infer

if TYPE_CHECKING:
  from tiny.codegen.kernel import Kernel


def lazy_gated_alternatives(uops: Sequence[UOp]) -> Set[UOp]:
  """The per-lane fallbacks of gated vector loads: each such LOAD's VECTORIZE alternative and the lane LOADs in it, when
  used only there. A renderer emits them inside the load's fallback path, never ahead of it, so a lane is only read when
  the whole-vector gate is false and that lane's own gate is true."""
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


# one digit of a tensor-core coordinate: (source, div, mod, stride) stands for ((L or e) // div % mod) * stride, where the
# source "lane" is the lane L inside the warp and "reg" the register element e of that lane; mod 0 means no modulo
LayoutTerm = Tuple[str, int, int, int]


@dataclass(frozen=True)
class RegisterLayout:
  """Where the lanes of a warp keep one tensor-core operand: register e of lane L holds element (row, col) of the matrix.

  row and col are sums of LayoutTerms, so the same data is evaluated on ints (the PYTHON emulator) and on the lane's index
  uop (the lowerer, which builds each lane's load addresses from it). count is the registers each lane holds.
  """
  count: int
  rows: Tuple[LayoutTerm, ...]
  cols: Tuple[LayoutTerm, ...]

  def __post_init__(self) -> None:
    for src, div, mod, stride in self.rows + self.cols:
      if src not in ("lane", "reg") or div < 1 or mod < 0 or stride < 1:
        raise ValueError(f"bad layout term {(src, div, mod, stride)}: source 'lane' or 'reg', div >= 1, mod >= 0, stride >= 1")

  @staticmethod
  def _coord(terms: Tuple[LayoutTerm, ...], lane: Any, e: int) -> Any:
    # the register part is a plain int (e is known when the code is built), the lane part an int or a uop
    lane_part, const = None, 0
    for src, div, mod, stride in terms:
      if src == "reg":
        v = e // div
        const += (v % mod if mod else v) * stride
        continue
      x = lane // div if div != 1 else lane
      x = x % mod if mod else x
      x = x * stride if stride != 1 else x
      lane_part = x if lane_part is None else lane_part + x
    if lane_part is None:
      return const
    return lane_part + const if const else lane_part

  def coords(self, lane: Any, e: int) -> Tuple[Any, Any]:
    """(row, col) of register e of lane `lane` (an int, or a uop of the lane index)."""
    return self._coord(self.rows, lane, e), self._coord(self.cols, lane, e)


@dataclass(frozen=True)
class TensorCore:
  """One matrix-multiply-accumulate instruction: D = A @ B + C with A (M x K), B (K x N), C and D (M x N).

  `dims` is (N, M, K). `threads` lists the (tensor-core dim, amount) pairs whose product is the warp; the
  order says which bits of the lane id walk which dim. `thread_local_sizes` gives, for A, B and C, how many
  elements each thread keeps in registers per upcast level. `layout` is the register layout of A, B and C (in that
  order): the device that declares the tensor core owns it, and both the lowerer and the PYTHON emulator read it here.
  """

  dims: Tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: List[Tuple[int, int]]
  thread_local_sizes: List[List[int]]
  layout: Tuple[RegisterLayout, ...] = ()

  def __post_init__(self) -> None:
    if self.layout and (len(self.layout) != 3 or tuple(x.count for x in self.layout) != self.elements_per_thread()):
      raise ValueError(f"{self}: layout needs one RegisterLayout for each of A, B, C with {self.elements_per_thread()} registers")

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

  def register_layout(self) -> Tuple[RegisterLayout, RegisterLayout, RegisterLayout]:
    """The layouts of A, B and C; a ValueError when the device declared this tensor core without one."""
    if len(self.layout) != 3:
      raise ValueError(f"tensor core {self} declares no register layout (TensorCore.layout), so kernels cannot use it")
    a, b, c = self.layout
    return a, b, c


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
  # how many of those vector registers the target has (0: not declared); for the device's own tiling heuristics, core never reads it
  simd_registers: int = 0
  has_local: bool = True
  has_shared: bool = True
  # the scheduler may make row kernels for this device (softmax, layernorm in one kernel: see engine/row_fusion.py); off
  # where one thread per row walking it serially is slow (a GPU wants the threads of a group to share each row)
  row_kernels: bool = False
  # SPECIAL indices are int32, so the launch grid stays below 2**31 per dim
  global_max: Optional[Tuple[int, ...]] = (0x8FFFFFFF,) * 3
  local_max: Optional[Tuple[int, ...]] = (0x8FFFFFFF,) * 3
  # most threads one workgroup may have in all (CUDA's maxThreadsPerBlock); None: only the per-dim local_max applies
  local_threads_max: Optional[int] = None
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

  def hand_coded_optimizations(self, k: Kernel) -> bool:
    """The device's own heuristic for choosing `k`'s opts; True when it chose them, False to leave `k` to core.

    `Kernel.hand_coded_optimizations` calls it after the required opts and after placing tensor cores (when the renderer
    declares some and one fits), before core's device-neutral heuristics: returning True ends the search with whatever
    opts the hook applied (`k.apply_opt`), returning False lets core's heuristics carry on from `k` as the hook left it.
    Tuning that depends on the hardware (register file, cache sizes, what its compiler vectorizes) belongs here, with
    the device, not in core. The hook may use core's building blocks (`Kernel.upcast_reused_axes`, `Kernel.unroll_reduce`,
    `Kernel.upcast_output`) with its own parameters. The default leaves every kernel to core."""
    return False

  def matmul_panel(self, m: int, k: int, n: int, dtype: DType) -> int:
    """Columns per panel when `Tensor.dot` should repack its right operand before an (m, k) @ (k, n) product; 0: never.

    A loop-based target whose kernels read the right matrix a strip of columns at a time streams each strip through
    the cache k rows apart, and row strides that are multiples of the page size alias in the cache. Copied once into
    contiguous panels (n // width, k, width), each strip is one sequential run; the copy costs O(k*n) against the
    product's O(m*k*n). GPU-like targets tile through local memory instead and keep the default."""
    return 0

  def matvec_split(self, m: int, k: int, n: int, dtype: DType) -> int:
    """Rows of the right operand per block when `Tensor.dot` should split an (m, k) @ (k, n) product along the reduce
    into per-block partial sums (one kernel) added up by a second one; 0: never.

    A loop-based target reads a row-major right matrix a strip of columns at a time, a short piece of every row per
    strip; with one row on the left nothing is reused and the product only streams the matrix. Split into blocks of
    rows, the first kernel walks a block's rows whole, side by side, which hardware prefetchers follow. The default
    keeps the single kernel."""
    return 0

  def pads_conv_input(self, padded_spatial: Tuple[int, ...], dtype: DType) -> bool:
    """True when `Tensor.conv2d` should copy a padded input into a zero-padded buffer before the conv; False: read it
    through the padded view.

    Through the view every input read near an edge is masked; on a loop-based target whose kernels load whole vectors
    of pixels each masked load checks its lanes and falls back to a gather, which costs more than one extra copy of
    the input when the image is large. The default reads the view."""
    return False

  def conv_channels_last(self, channels: int, spatial: Tuple[int, ...], dtype: DType) -> bool:
    """True when a stride-1 conv's backward (`function.Conv`) should lay out one of its reduces with `channels`
    channels innermost: the weight gradient (channels: the input's, spatial: the output's) and the input gradient
    (channels: the input's, spatial: the input's) then read channels-last copies of their operands and vectorize along
    the channels; False: keep the channels-first layout, vectorized along a row of `spatial`.

    A loop-based target vectorizes a channels-first conv along an image row, and a short row (20, 10 or 6 pixels)
    fills only part of a vector; channels that are a multiple of the vector fill every lane, for the price of
    transposing copies of the operands. The default keeps the channels-first layout."""
    return False

  def render(self, name: str, uops: List[UOp]) -> str:
    """Source code for the kernel `name` from its linearized uops."""
    raise NotImplementedError(f"{type(self).__name__} does not implement render")
