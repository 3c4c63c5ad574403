"""Reading AMD GPU code objects (what HIPCompiler writes and hipModuleLoadData takes) without ROCm.

A code object is an ELF64 shared object with e_machine EM_AMDGPU; the low byte of e_flags names the GPU (EF_AMDGPU_MACH).
Each kernel is a function symbol `name` plus its kernel descriptor `name.kd`; the `NT_AMDGPU_METADATA` note holds a
msgpack map whose `amdhsa.kernels` entries describe the arguments (offset, size, kind) and the kernarg segment size.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
NT_AMDGPU_METADATA = 32
# EF_AMDGPU_MACH values of the targets tiny knows by name (LLVM's AMDGPUUsage; each checked against clang-16's output,
# except gfx941/gfx942, which need a newer clang)
MACH = {"gfx900": 0x2C, "gfx906": 0x2F, "gfx908": 0x30, "gfx90a": 0x3F, "gfx940": 0x40, "gfx941": 0x4B, "gfx942": 0x4C,
        "gfx1030": 0x36, "gfx1031": 0x37, "gfx1032": 0x38, "gfx1034": 0x3E, "gfx1035": 0x3D, "gfx1036": 0x45,
        "gfx1100": 0x41, "gfx1101": 0x46, "gfx1102": 0x47, "gfx1103": 0x44}
ARCH_OF_MACH = {v: k for k, v in MACH.items()}


class CodeObjectError(ValueError):
  """The bytes are not an AMD GPU code object (or one this reader cannot parse)."""


@dataclass(frozen=True)
class KernelArg:
  """One explicit argument of a kernel as the metadata describes it."""
  offset: int
  size: int
  value_kind: str   # "global_buffer" for pointers, "by_value" for ints


@dataclass(frozen=True)
class KernelInfo:
  """What a launch needs to know about one kernel of a code object."""
  name: str
  kernarg_segment_size: int
  kernarg_segment_align: int
  group_segment_fixed_size: int
  private_segment_fixed_size: int
  max_flat_workgroup_size: int
  wavefront_size: int
  args: Tuple[KernelArg, ...]


# *** msgpack (the subset AMDGPU metadata uses) ***

def unpack_msgpack(data: bytes) -> Any:
  """Decode one msgpack value (maps, arrays, strings, binary, ints, floats, bools, nil)."""
  val, end = _unpack(data, 0)
  if end > len(data):
    raise CodeObjectError("truncated msgpack metadata")
  return val


def _unpack(d: bytes, i: int) -> Tuple[Any, int]:  # noqa: C901 - one branch per msgpack type
  if i >= len(d):
    raise CodeObjectError("truncated msgpack metadata")
  b = d[i]
  i += 1
  if b <= 0x7F:
    return b, i
  if b >= 0xE0:
    return b - 0x100, i
  if 0x80 <= b <= 0x8F:
    return _unpack_map(d, i, b & 0x0F)
  if 0x90 <= b <= 0x9F:
    return _unpack_array(d, i, b & 0x0F)
  if 0xA0 <= b <= 0xBF:
    n = b & 0x1F
    return d[i:i + n].decode(), i + n
  fixed = {0xC0: (None, 0), 0xC2: (False, 0), 0xC3: (True, 0)}
  if b in fixed:
    return fixed[b][0], i
  ints = {0xCC: "B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: "b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}
  if b in ints:
    fmt = ints[b]
    return struct.unpack_from(fmt, d, i)[0], i + struct.calcsize(fmt)
  lens = {0xD9: ("B", "str"), 0xDA: (">H", "str"), 0xDB: (">I", "str"), 0xC4: ("B", "bin"), 0xC5: (">H", "bin"), 0xC6: (">I", "bin"),
          0xDC: (">H", "array"), 0xDD: (">I", "array"), 0xDE: (">H", "map"), 0xDF: (">I", "map")}
  if b not in lens:
    raise CodeObjectError(f"unsupported msgpack type byte 0x{b:02x}")
  fmt, kind = lens[b]
  n = struct.unpack_from(fmt, d, i)[0]
  i += struct.calcsize(fmt)
  if kind == "str":
    return d[i:i + n].decode(), i + n
  if kind == "bin":
    return bytes(d[i:i + n]), i + n
  return _unpack_array(d, i, n) if kind == "array" else _unpack_map(d, i, n)


def _unpack_array(d: bytes, i: int, n: int) -> Tuple[List[Any], int]:
  out = []
  for _ in range(n):
    v, i = _unpack(d, i)
    out.append(v)
  return out, i


def _unpack_map(d: bytes, i: int, n: int) -> Tuple[Dict[Any, Any], int]:
  out = {}
  for _ in range(n):
    k, i = _unpack(d, i)
    v, i = _unpack(d, i)
    out[k] = v
  return out, i


# *** ELF ***

def _check_elf(lib: bytes) -> None:
  if len(lib) < 64 or lib[:4] != b"\x7fELF":
    raise CodeObjectError("not an ELF file")
  if lib[4] != 2 or lib[5] != 1:
    raise CodeObjectError("not a little-endian ELF64 file")
  if (machine := struct.unpack_from("<H", lib, 18)[0]) != EM_AMDGPU:
    raise CodeObjectError(f"not an AMD GPU code object (e_machine {machine}, want {EM_AMDGPU})")


def mach(lib: bytes) -> int:
  """EF_AMDGPU_MACH of the code object (the GPU it was built for)."""
  _check_elf(lib)
  return struct.unpack_from("<I", lib, 48)[0] & 0xFF


def code_object_arch(lib: bytes) -> str:
  """'gfx1100' & co.: the GPU the code object was built for (`mach_0x..` for a GPU this reader has no name for)."""
  m = mach(lib)
  return ARCH_OF_MACH.get(m, f"mach_0x{m:02x}")


def _sections(lib: bytes) -> List[Tuple[str, int, int, int, int, int]]:
  """(name, type, addr, offset, size, link) of each section."""
  shoff, = struct.unpack_from("<Q", lib, 40)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", lib, 58)
  raw = [struct.unpack_from("<IIQQQQIIQQ", lib, shoff + i * shentsize) for i in range(shnum)]
  names_off = raw[shstrndx][4]

  def name(off: int) -> str:
    end = lib.index(b"\x00", names_off + off)
    return lib[names_off + off:end].decode()
  return [(name(s[0]), s[1], s[3], s[4], s[5], s[6]) for s in raw]


def symbols(lib: bytes) -> Dict[str, Tuple[int, int, int]]:
  """{name: (value, size, type)} of the code object's symbol table (.symtab, else .dynsym)."""
  _check_elf(lib)
  secs = _sections(lib)
  tables = [s for s in secs if s[1] == 2] or [s for s in secs if s[1] == 11]   # SHT_SYMTAB, else SHT_DYNSYM
  out: Dict[str, Tuple[int, int, int]] = {}
  for _, _, _, off, size, link in tables[:1]:
    stroff = secs[link][3]
    for i in range(size // 24):
      st_name, st_info, _, _, st_value, st_size = struct.unpack_from("<IBBHQQ", lib, off + i * 24)
      if st_name:
        end = lib.index(b"\x00", stroff + st_name)
        out[lib[stroff + st_name:end].decode()] = (st_value, st_size, st_info & 0xF)
  return out


def kernel_names(lib: bytes) -> List[str]:
  """The kernels of the code object: the names that have a kernel descriptor `<name>.kd`."""
  syms = symbols(lib)
  return sorted(n[:-3] for n in syms if n.endswith(".kd") and n[:-3] in syms)


def metadata(lib: bytes) -> Dict[str, Any]:
  """The decoded NT_AMDGPU_METADATA note (a dict with `amdhsa.kernels`, `amdhsa.target`, ...)."""
  _check_elf(lib)
  for _, stype, _, off, size, _ in _sections(lib):
    if stype != 7:   # SHT_NOTE
      continue
    i = off
    while i + 12 <= off + size:
      namesz, descsz, ntype = struct.unpack_from("<III", lib, i)
      name = lib[i + 12:i + 12 + namesz].rstrip(b"\x00")
      desc_at = i + 12 + ((namesz + 3) & ~3)
      if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
        return unpack_msgpack(lib[desc_at:desc_at + descsz])
      i = desc_at + ((descsz + 3) & ~3)
  raise CodeObjectError("the code object has no AMDGPU metadata note")


def kernel_info(lib: bytes) -> Dict[str, KernelInfo]:
  """{kernel name: KernelInfo} from the code object's metadata."""
  out = {}
  for k in metadata(lib).get("amdhsa.kernels", []):
    args = tuple(KernelArg(a[".offset"], a[".size"], a[".value_kind"]) for a in k.get(".args", []))
    out[k[".name"]] = KernelInfo(k[".name"], k[".kernarg_segment_size"], k.get(".kernarg_segment_align", 8), k.get(".group_segment_fixed_size", 0),
                                 k.get(".private_segment_fixed_size", 0), k.get(".max_flat_workgroup_size", 1024), k.get(".wavefront_size", 64),
                                 args)
  return out
