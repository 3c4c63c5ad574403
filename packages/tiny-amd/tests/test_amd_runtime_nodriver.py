"""The parts of the AMD runtime that need no GPU: kernel-argument packing (checked against the layout clang writes into the
code object's metadata), code-object reading, launch-size checks, and the errors where HIP is missing."""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, List

import pytest

from tiny.backend import Kernel, to_function_name

from tiny_amd.codeobject import CodeObjectError, KernelArg, code_object_arch, kernel_info, kernel_names, metadata, unpack_msgpack
from tiny_amd.opsuite import op_suite_schedule
from tiny_amd.plugin import _hip_loads  # the probe's own check
from tiny_amd.renderer import HIPRenderer
from tiny_amd.runtime import (HIPError, HIPMissing, HIPProgram, arch_from_properties, check_launch_dims, default_kernargs, driver_problem, hip,
                              launch_extra, pack_kernargs)


def compiled(case: str, opt: str = "hand") -> Any:
  """(program, code object) of the first kernel of an op-suite case, for gfx1100; skips without clang."""
  from tiny_amd.compiler import AMDToolchainError, HIPCompiler
  try:
    compiler = HIPCompiler("gfx1100")
  except AMDToolchainError as e:
    pytest.skip(str(e))
  k = Kernel(op_suite_schedule([case])[case][0].ast, opts=HIPRenderer("gfx1100"))
  if opt == "hand":
    k.hand_coded_optimizations()
  prg = k.to_program()
  return prg, compiler.compile(prg.src)


def test_default_kernargs_align_pointers_and_ints() -> None:
  assert [(a.offset, a.size) for a in default_kernargs(3, 2)] == [(0, 8), (8, 8), (16, 8), (24, 4), (28, 4)]
  assert [(a.offset, a.size) for a in default_kernargs(1, 1)] == [(0, 8), (8, 4)]
  assert [a.value_kind for a in default_kernargs(1, 2)] == ["global_buffer", "by_value", "by_value"]


@pytest.mark.parametrize("case", ["add", "symbolic", "matmul", "conv2d", "casts"])
def test_kernargs_match_what_clang_laid_out(case: str) -> None:
  prg, lib = compiled(case)
  info = kernel_info(lib)[to_function_name(prg.name)]
  ours = default_kernargs(len(prg.globals), len(prg.vars))
  assert info.args == ours
  assert info.kernarg_segment_size == len(pack_kernargs([0] * len(prg.globals), [0] * len(prg.vars)))


def test_pack_kernargs_writes_each_value_at_its_offset() -> None:
  ptrs, vals = [0x7F0000001000, 0x7F0000002040, 0x10], [20, -3]
  raw = pack_kernargs(ptrs, vals)
  assert len(raw) == 32
  assert list(struct.unpack("<QQQii", raw)) == ptrs + vals
  # a layout from metadata with a gap is honoured
  gap = (KernelArg(0, 8, "global_buffer"), KernelArg(16, 4, "by_value"))
  assert pack_kernargs([5], [7], gap) == struct.pack("<Q", 5) + bytes(8) + struct.pack("<i", 7)
  with pytest.raises(ValueError, match="the kernel takes"):
    pack_kernargs([1, 2], [], default_kernargs(1, 1))
  with pytest.raises(ValueError, match="the kernel takes"):
    pack_kernargs([1], [2, 3], default_kernargs(1, 1))


def test_launch_extra_points_at_the_packed_arguments() -> None:
  packed = pack_kernargs([0x1234, 0x5678], [9])
  extra, _keep = launch_extra(packed)
  assert [extra[0], extra[2], extra[4]] == [1, 2, 3]   # HIP_LAUNCH_PARAM_BUFFER_POINTER, _SIZE, _END
  assert ctypes.string_at(extra[1], len(packed)) == packed
  assert ctypes.c_size_t.from_address(extra[3]).value == len(packed) == 20


def test_launch_dims_are_checked_against_the_limits() -> None:
  r = HIPRenderer("gfx1100")
  lim = (r.global_max, r.local_max, r.local_threads_max)
  assert check_launch_dims([4, 2], [32], *lim) == ((4, 2, 1), (32, 1, 1))
  with pytest.raises(ValueError, match="workgroup size 2048 in dim x is outside 1..1024"):
    check_launch_dims([1], [2048], *lim)
  with pytest.raises(ValueError, match=r"\[32, 32, 2\] = 2048 threads is more than the 1024"):
    check_launch_dims([1], [32, 32, 2], *lim)
  with pytest.raises(ValueError, match="workgroup count 70000 in dim y"):
    check_launch_dims([1, 70000], [1], *lim)
  with pytest.raises(ValueError, match="workgroup count 0 in dim x"):
    check_launch_dims([0], [1], *lim)


def test_code_object_reader() -> None:
  prg, lib = compiled("reduce_sum")
  name = to_function_name(prg.name)
  assert code_object_arch(lib) == "gfx1100" and kernel_names(lib) == [name]
  meta = metadata(lib)
  assert meta["amdhsa.target"].startswith("amdgcn-amd-amdhsa--gfx1100")
  info = kernel_info(lib)[name]
  assert info.wavefront_size == 32 and (info.group_segment_fixed_size > 0) == ("shared" in prg.src)
  assert info.max_flat_workgroup_size == math.prod(prg.local_size or [1])
  with pytest.raises(CodeObjectError, match="not an ELF"):
    kernel_names(b"not an elf" * 10)
  with pytest.raises(CodeObjectError, match="e_machine 62"):
    kernel_names(lib[:18] + struct.pack("<H", 62) + lib[20:])


def test_msgpack_subset() -> None:
  # {"a": [1, -1, 300, "xy", true, null], "b": 1.5, "c": -200}, encoded by hand from the msgpack spec
  raw = (b"\x83" + b"\xa1a" + b"\x96\x01\xff\xcd\x01\x2c\xa2xy\xc3\xc0" + b"\xa1b" + b"\xcb" + struct.pack(">d", 1.5) + b"\xa1c" + b"\xd1" +
         struct.pack(">h", -200))
  assert unpack_msgpack(raw) == {"a": [1, -1, 300, "xy", True, None], "b": 1.5, "c": -200}
  with pytest.raises(CodeObjectError):
    unpack_msgpack(b"\x92\x01")


def test_arch_from_device_properties() -> None:
  props: List[bytes] = [b"AMD Radeon RX 7900 XTX".ljust(256, b"\0"), bytes(64), b"gfx1100".ljust(256, b"\0"), bytes(100)]
  assert arch_from_properties(b"".join(props)) == "gfx1100"
  assert arch_from_properties(bytes(300) + b"gfx90a:sramecc+:xnack-\0" + bytes(10)) == "gfx90a:sramecc+:xnack-"
  assert arch_from_properties(bytes(512)) is None


@pytest.mark.skipif(_hip_loads(), reason="libamdhip64 is installed here")
def test_without_hip_every_entry_says_why() -> None:
  with pytest.raises(HIPMissing, match="no HIP runtime"):
    hip()
  assert (driver_problem() or "").startswith("no HIP runtime (libamdhip64) found")


def test_program_checks_the_kernel_name_before_touching_hip() -> None:
  _, lib = compiled("add")
  with pytest.raises(HIPError, match="no kernel 'not_there'"):
    HIPProgram(0, "not_there", lib)
