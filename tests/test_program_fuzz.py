"""The whole-program differential fuzzer (tiny.testing.program_fuzz): random Tensor programs on every compute device
under NOOPT, the heuristic and random opt sequences, compared with torch; and tests of the fuzzer itself (its
references agree, its reproducers run, it fails on a wrong device result).

The default hypothesis profile runs a few programs per device (CI); HYPOTHESIS_PROFILE=fuzz runs thousands.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tiny.codegen.kernel import Opt, OptOps
from tiny.dtype import DType, dtypes
from tiny.ops import BinaryOps
from tiny.registry import Device
from tiny.testing import program_fuzz as pf
from tiny.testing.program_fuzz import (KernelRecord, Mismatch, OptSetting, ProgramRun, check_program, compare_results, default_settings,
                                       make_input, make_program, programs, reference_results, reproducer, run_program)
from tiny.testing.strategies import register_profiles

register_profiles()

COMPUTE = [d for d in ("CLANG", "LLVM", "PYTHON") if d in Device.get_available_devices()]
FUZZ = os.getenv("HYPOTHESIS_PROFILE", "default") != "default"
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def _examples(n: int, share: int = 1) -> int:
  """n examples in the quick run; under HYPOTHESIS_PROFILE=fuzz the profile's count (divided by share)."""
  return n if not FUZZ else max(n, settings().max_examples // share)


# PYTHON interprets every kernel: fewer and smaller programs there
QUICK = {"CLANG": 5, "LLVM": 5, "PYTHON": 4}


def _program_test(device: str) -> Callable[..., Any]:
  small = device == "PYTHON"

  @settings(max_examples=_examples(QUICK.get(device, 4), 3 if small else 1), deadline=None, suppress_health_check=HEALTH)
  @given(prog=programs(max_ops=6 if small else 10, max_size=64 if small else 128), seed=st.integers(0, 2 ** 31 - 1))
  def run(prog: pf.Program, seed: int) -> None:
    check_program(prog, device, default_settings(seed, n_random=2 if FUZZ else 1))
  return run


@pytest.mark.parametrize("device", COMPUTE)
def test_random_programs(device: str) -> None:
  _program_test(device)()


# *** the pad + reduce miscompile, as a fuzzer program ***

def _pad_plus_reduce() -> pf.Program:
  return make_program([make_input("a", np.ones((4, 4), np.float32)), make_input("b", np.ones((4, 5, 2), np.float32))],
                      [("v1", "pad", ("a",), ((0, 0), (1, 0))), ("v2", "sum", ("b",), ((2,), False)), ("v3", "add", ("v1", "v2"), None)], ["v3"])


@pytest.mark.parametrize("device", COMPUTE)
def test_pad_plus_unrolled_reduce_regression(device: str) -> None:
  """a.pad(((0,0),(1,0))) + b.sum(2) stored twice to one address with its reduce unrolled (a padded 2 instead of 3)."""
  prog = _pad_plus_reduce()
  want = reference_results(prog, "numpy")
  np.testing.assert_array_equal(want["v3"], np.pad(np.ones((4, 4), np.float32), ((0, 0), (1, 0))) + 2)
  unrolled = OptSetting("given", opts=((Opt(OptOps.UNROLL, 0, 0),),))
  check_program(prog, device, default_settings(7, n_random=2) + [unrolled], want=want)
  assert run_program(prog, device, unrolled).kernels[0].opts == (Opt(OptOps.UNROLL, 0, 0),)


# *** the fuzzer can fail ***

def _faulty_python_add(monkeypatch: pytest.MonkeyPatch) -> None:
  """Make the PYTHON device add floats wrongly (x + y + 1); index arithmetic (ints) stays right."""
  from tiny.runtime import ops_python
  real = ops_python.lane_alu

  def lane_alu(op: Any, dtype: DType) -> Callable[..., Any]:
    fxn = real(op, dtype)
    return (lambda *x: fxn(*x) + 1.0) if op is BinaryOps.ADD and dtypes.is_float(dtype) else fxn
  monkeypatch.setattr(ops_python, "lane_alu", lane_alu)


def _add_program() -> pf.Program:
  x = np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5
  return make_program([make_input("a", x), make_input("b", -x[:1])], [("v1", "add", ("a", "b"), None), ("v2", "mul", ("v1",), 2.0)], ["v2"])


def test_wrong_device_result_is_detected_and_reproducer_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
  prog = _add_program()
  _faulty_python_add(monkeypatch)
  with pytest.raises(AssertionError, match="program fuzz found a difference") as exc:
    check_program(prog, "PYTHON", [OptSetting("noopt")], backend="numpy")
  text = str(exc.value).split("reproducer:\n", 1)[1]
  assert "# v2: 6 of 6 elements differ" in text and "device PYTHON" in text
  compile(text, "reproducer.py", "exec")
  # with the fault still in place the reproducer fails the same way ...
  with pytest.raises(AssertionError, match="v2"):
    exec(text, {})
  monkeypatch.undo()
  # ... and in a fresh process, on the correct device, it passes
  script = tmp_path / "repro.py"
  script.write_text(text)
  res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
  assert res.returncode == 0, res.stderr


def test_hypothesis_finds_and_shrinks_a_device_fault(monkeypatch: pytest.MonkeyPatch) -> None:
  _faulty_python_add(monkeypatch)

  @settings(max_examples=30, deadline=None, database=None, suppress_health_check=HEALTH, phases=[Phase.generate, Phase.shrink])
  @given(prog=programs(max_ops=3, max_size=16, backward=False, ops=("add", "sub", "mul")))
  def fuzz(prog: pf.Program) -> None:
    check_program(prog, "PYTHON", [OptSetting("noopt")], backend="numpy")
  with pytest.raises(AssertionError, match="program fuzz found a difference") as exc:
    fuzz()
  # shrunk to a couple of ops (an add, perhaps behind a helper op)
  assert str(exc.value).count("\nv") <= 3, str(exc.value)


def test_comparator_flags_corrupted_results() -> None:
  prog = _pad_plus_reduce()
  want = reference_results(prog, "numpy")
  assert compare_results(prog, {"v3": want["v3"].copy()}, want) == []
  bad = want["v3"].copy()
  bad[2, 0] += 1e-6   # exact values are compared bit for bit
  (m,) = compare_results(prog, {"v3": bad}, want)
  assert m.name == "v3" and "1 of 20 elements differ" in m.message and "(2, 0)" in m.message
  assert compare_results(prog, {"v3": want["v3"][:, :4]}, want)[0].message.startswith("shape")
  assert compare_results(prog, {}, want)[0].message == "missing from the run"


def test_comparator_tolerates_rounding_only_where_values_are_inexact() -> None:
  x = np.array([[0.5, 1.25, 2.0]], np.float32)
  prog = make_program([make_input("a", x)], [("v1", "exp", ("a",), None), ("v2", "neg", ("a",), None)], ["v1", "v2"])
  vals = prog.values()
  assert not vals["v1"].exact and vals["v2"].exact
  want = reference_results(prog, "numpy")
  near = {"v1": want["v1"] * np.float32(1 + 1e-6), "v2": want["v2"]}
  assert compare_results(prog, near, want) == []
  far = {"v1": want["v1"] * np.float32(1.01), "v2": want["v2"]}
  assert [m.name for m in compare_results(prog, far, want)] == ["v1"]


def test_dtype_mismatch_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
  prog = make_program([make_input("a", np.ones((3,), np.float32))], [("v1", "cast", ("a",), "int32")], ["v1"])
  real = pf.run_program

  def wrong_dtype(program: pf.Program, device: str, setting: OptSetting = OptSetting("heuristic")) -> ProgramRun:
    run = real(program, device, setting)
    run.dtypes["v1"] = dtypes.int64
    return run
  monkeypatch.setattr(pf, "run_program", wrong_dtype)
  with pytest.raises(AssertionError, match="v1: dtype dtypes.long, expected int32"):
    check_program(prog, "PYTHON", [OptSetting("noopt")])


def test_exception_is_reported_with_reproducer() -> None:
  prog = _add_program()
  run = ProgramRun({}, [KernelRecord("E_2_3", (Opt(OptOps.UPCAST, 0, 2),))], RuntimeError("boom"))
  text = reproducer(prog, "CLANG", OptSetting("random", seed=3), run, reference_results(prog, "numpy"),
                    [Mismatch("v2", "something")], "numpy")
  assert "# raised RuntimeError: boom" in text and "E_2_3: [Opt(op=OptOps.UPCAST, axis=0, amt=2)]" in text
  assert "realize_with_opts(results, [[Opt(op=OptOps.UPCAST, axis=0, amt=2)]])" in text
  compile(text, "reproducer.py", "exec")
  # an error before any kernel was built (the scheduler) replays the setting itself
  early = reproducer(prog, "CLANG", OptSetting("noopt"), ProgramRun({}, [], RuntimeError("cycle")), {})
  assert "realize_with_opts(results, OptSetting(kind='noopt'" in early and "(none ran)" in early
  compile(early, "reproducer.py", "exec")


# *** the fuzzer's parts ***

@settings(max_examples=_examples(25), deadline=None, suppress_health_check=HEALTH)
@given(prog=programs())
def test_numpy_and_torch_references_agree(prog: pf.Program) -> None:
  """The two references are independent implementations of the op records: they agree (exact values bit for bit)."""
  pytest.importorskip("torch")
  t, n = reference_results(prog, "torch"), reference_results(prog, "numpy")
  assert compare_results(prog, n, {k: v for k, v in t.items() if k in n}) == []
  for name, v in t.items():
    assert not (v.dtype.kind == "f" and not np.all(np.isfinite(v))), f"{name} is not finite:\n" + "\n".join(prog.source())


def test_without_torch_only_forward_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
  x = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
  prog = make_program([make_input("a", x, requires_grad=True), make_input("w", np.ones((2,), np.float32))],
                      [("v1", "sum", ("a",), ((1,), False))], ["v1"], loss=[("v1", "w")])
  assert prog.grad_inputs == ("a",) and prog.result_names() == ["v1", "grad(a)"]
  monkeypatch.setitem(sys.modules, "torch", None)   # import torch now raises ImportError
  assert not pf.torch_available()
  want = check_program(prog, "PYTHON", [OptSetting("noopt")])
  assert list(want) == ["v1"]
  np.testing.assert_array_equal(want["v1"], x.sum(1))


def test_gradients_are_compared() -> None:
  pytest.importorskip("torch")
  x = np.array([[0.5, -1.0, 2.0], [2.0, 0.25, -0.5]], np.float32)
  prog = make_program([make_input("a", x, requires_grad=True), make_input("w", np.array([1.0, -2.0], np.float32))],
                      [("v1", "max", ("a",), ((1,), False)), ("v2", "relu", ("a",), None), ("v3", "sum", ("v2",), ((1,), False)),
                       ("v4", "add", ("v1", "v3"), None)], ["v4"], loss=[("v4", "w")])
  want = check_program(prog, "CLANG" if "CLANG" in COMPUTE else "PYTHON", default_settings(1))
  # d/da of w·(max_j a_ij + sum_j relu(a_ij)), by hand
  np.testing.assert_array_equal(want["grad(a)"], np.array([[1, 0, 2], [-4, -2, 0]], np.float32))


def test_make_program_refuses_unsafe_ops() -> None:
  a = make_input("a", np.array([-1.0, 2.0], np.float32))
  with pytest.raises(ValueError, match="v1 = log"):
    make_program([a], [("v1", "log", ("a",), None)], ["v1"])    # log of a possibly negative value
  with pytest.raises(ValueError, match="v1 = div"):
    make_program([a], [("v1", "div", ("a", "a"), None)], ["v1"])   # a divisor that may be zero
  with pytest.raises(ValueError, match="unknown source"):
    make_program([a], [("v1", "neg", ("b",), None)], ["v1"])
  e = make_program([a], [("v1", "exp", ("a",), None)], ["v1"])
  with pytest.raises(ValueError, match="v2 = cast"):   # truncating a rounded value could land either side of an integer
    make_program(e.inputs, [("v1", "exp", ("a",), None), ("v2", "cast", ("v1",), "int32")], ["v2"])


def test_given_opts_replay_the_same_kernels() -> None:
  prog = _pad_plus_reduce()
  dev = COMPUTE[0]
  first = run_program(prog, dev, OptSetting("heuristic+random", seed=5))
  assert first.error is None and first.kernels
  again = run_program(prog, dev, OptSetting("given", opts=tuple(k.opts for k in first.kernels)))
  assert again.error is None and again.kernels == first.kernels
  np.testing.assert_array_equal(again.results["v3"], first.results["v3"])
  with pytest.raises(ValueError, match="unknown OptSetting kind"):
    OptSetting("fast")


def test_source_is_the_program() -> None:
  """Program.source() is plain tiny code: run by itself it gives the reference values."""
  prog = make_program([make_input("a", np.arange(6, dtype=np.int32).reshape(2, 3)), make_input("i", np.array([2, 0], np.int32))],
                      [("v1", "index", ("a", "i"), (("slice", None, None, -1), ("tensor", 0))), ("v2", "cumsum", ("v1",), 0)], ["v2"])
  ns: dict = {"DEVICE": COMPUTE[0]}
  exec("import numpy as np\nfrom tiny.tensor import Tensor\nfrom tiny.dtype import dtypes\n" + "\n".join(prog.source()), ns)
  np.testing.assert_array_equal(ns["v2"].numpy(), np.cumsum(np.arange(6).reshape(2, 3)[::-1][:, [2, 0]], 0))
  np.testing.assert_array_equal(reference_results(prog, "numpy")["v2"], ns["v2"].numpy())


@pytest.mark.skipif("CLANG" not in COMPUTE or not os.path.exists("/proc/self/maps"), reason="needs CLANG and Linux's /proc/self/maps")
def test_runs_unload_their_kernels() -> None:
  """Every run builds fresh kernels; CLANG keeps a loaded .so mapped for good, so without unloading them a long fuzz
  run ran out of memory mappings (after ~10k kernels)."""
  def mappings() -> int:
    with open("/proc/self/maps") as f:
      return sum(1 for _ in f)
  prog = _pad_plus_reduce()
  check_program(prog, "CLANG", default_settings(0))
  before = mappings()
  for seed in range(1, 6):
    check_program(prog, "CLANG", default_settings(seed * 10, n_random=4))
  assert mappings() - before < 10, "kernels loaded by the fuzzer stay mapped"


def test_time_boxed_fuzzing_checks_programs_and_stops_at_the_failure_limit(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
  """`python -m tiny.testing.program_fuzz DEVICE --seconds S` (the hardware-check script's fuzzer): it checks drawn
  programs on the device, and stops at --max-failures, printing each reproducer."""
  checked, failures = pf.fuzz_for(COMPUTE[0], 0.5, seed=1)
  assert checked >= 1 and failures == []
  calls = []

  def broken(prog: Any, device: str, settings: Any) -> None:
    calls.append(device)
    raise AssertionError(f"reproducer {len(calls)}")
  monkeypatch.setattr(pf, "check_program", broken)
  assert pf.main([COMPUTE[0], "--seconds", "30", "--max-failures", "2"]) == 1
  out = capsys.readouterr().out
  assert len(calls) == 2 and "reproducer 1" in out and "reproducer 2" in out and f"{COMPUTE[0]}: 2 programs, 2 failed" in out


def test_seed_decides_the_programs_in_every_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
  """--seed S reproduces a run: program i is drawn from f"{S}:{i}" the same way in any process (hypothesis' .example()
  could not be seeded, so a failure whose reproducer was not saved was lost); --only i checks just that program, and
  each failure is printed as soon as it is found, with the command that reruns it."""
  code = "from tiny.testing.program_fuzz import draw_program; print(chr(10).join(draw_program('5:3').source()))"
  runs = [subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": h}, capture_output=True, text=True, timeout=300)
          for h in ("1", "2")]
  assert runs[0].returncode == 0, runs[0].stderr[-2000:]
  assert runs[0].stdout == runs[1].stdout and "Tensor(" in runs[0].stdout
  assert runs[0].stdout.strip() == "\n".join(pf.draw_program("5:3").source())
  assert pf.draw_program("5:3").source() != pf.draw_program("5:4").source()
  seen = []

  def broken(prog: Any, device: str, settings: Any) -> None:
    seen.append(prog)
    raise AssertionError("reproducer of the drawn program")
  monkeypatch.setattr(pf, "check_program", broken)
  assert pf.main([COMPUTE[0], "--seed", "5", "--only", "3"]) == 1
  out = capsys.readouterr().out
  assert out.startswith(f"{COMPUTE[0]}: seed 5\n") and "program 3 failed (rerun: --seed 5 --only 3)" in out
  assert len(seen) == 1 and seen[0] == pf.draw_program("5:3")


# *** integer division and unsigned wrap-around ***

def _ints(name: str, values: Any, dt: Any) -> pf.Input:
  return make_input(name, np.array(values, dtype=dt))


@pytest.mark.parametrize("op", ["floordiv", "mod"])
@pytest.mark.parametrize("xr,yr", [((-7, 7), (1, 3)), ((-7, 7), (-3, -1)), ((0, 9), (2, 5)), ((-9, -2), (3, 4)), ((2, 5), (6, 8)),
                                   ((-5, -1), (-8, -6)), ((-128, 127), (-2, -1))])
def test_int_division_ranges_hold_every_result(op: str, xr: Any, yr: Any) -> None:
  """The model's interval for // and % holds the result of every pair of operands in the operands' intervals, and the
  floor quotient's bounds are reached (the corners are exact); int8 -128 // -1 does not fit, so that is refused."""
  xs, ys = np.arange(xr[0], xr[1] + 1), np.arange(yr[0], yr[1] + 1)
  dt = np.int8 if xr[0] == -128 else np.int32
  inputs = [_ints("a", xs, dt), _ints("b", ys.reshape(-1, 1), dt)]
  got = np.floor_divide(xs, ys.reshape(-1, 1)) if op == "floordiv" else np.remainder(xs, ys.reshape(-1, 1))
  if got.max() > np.iinfo(dt).max:
    with pytest.raises(ValueError, match=f"v1 = {op}"):
      make_program(inputs, [("v1", op, ("a", "b"), None)], ["v1"])
    return
  v = make_program(inputs, [("v1", op, ("a", "b"), None)], ["v1"]).ops[0].value
  assert v.lo <= got.min() and got.max() <= v.hi
  if op == "floordiv":
    assert (v.lo, v.hi) == (got.min(), got.max())
  np.testing.assert_array_equal(reference_results(make_program(inputs, [("v1", op, ("a", "b"), None)], ["v1"]), "numpy")["v1"], got)


def test_int_division_and_wrapping_refusals() -> None:
  a, z = _ints("a", [-3, 0, 5], np.int32), _ints("z", [0, 1, 2], np.int32)
  with pytest.raises(ValueError, match="v1 = floordiv"):
    make_program([a, z], [("v1", "floordiv", ("a", "z"), None)], ["v1"])   # a divisor range holding 0
  with pytest.raises(ValueError, match="v1 = mod"):
    make_program([a], [("v1", "mod", ("a",), 0)], ["v1"])
  with pytest.raises(ValueError, match="v1 = floordiv"):
    make_program([make_input("f", np.ones(2, np.float32))], [("v1", "floordiv", ("f",), 2)], ["v1"])   # ints only
  # signed ints still may not overflow; uint8 wraps, and its range then is the whole dtype
  with pytest.raises(ValueError, match="v1 = add"):
    make_program([_ints("s", [100, 120], np.int8)], [("v1", "add", ("s",), 100)], ["v1"])
  u = make_program([_ints("u", [0, 254], np.uint8)], [("v1", "add", ("u",), 2), ("v2", "mul", ("u",), 5), ("v3", "sub", ("u",), 1)], ["v1"])
  assert [(o.value.lo, o.value.hi) for o in u.ops] == [(0, 255)] * 3
  fits = make_program([_ints("u", [0, 200], np.uint8)], [("v1", "add", ("u",), 55)], ["v1"])
  assert (fits.ops[0].value.lo, fits.ops[0].value.hi) == (55, 255)
  # an int converted to uint8 wraps too (C defines it); a negative float converted to uint8 is undefined, so refused
  c = make_program([_ints("s", [-3, 4], np.int32)], [("v1", "cast", ("s",), "uint8")], ["v1"])
  assert (c.ops[0].value.lo, c.ops[0].value.hi) == (0, 255)
  with pytest.raises(ValueError, match="v1 = cast"):
    make_program([make_input("f", np.array([-1.0, 2.0], np.float32))], [("v1", "cast", ("f",), "uint8")], ["v1"])


def _wrapping_division_program() -> pf.Program:
  """uint8 (x + 2) // 2 and (x * 6 + 1) % 3 next to signed floor division and remainder by a positive and a negative
  tensor (the range model holds one sign per tensor): the folds once split the wrapping sum (254 + 2) // 2 into 127 + 1."""
  u = _ints("u", [0, 1, 2, 3, 127, 128, 253, 254, 255], np.uint8)
  s = _ints("s", [-9, -7, -1, 0, 1, 5, 7, 8, 9], np.int32)
  d = _ints("d", [3, 3, 2, 2, 4, 4, 5, 1, 1], np.int32)
  e = _ints("e", [-3, -3, -2, -2, -4, -4, -5, -1, -1], np.int32)
  return make_program([u, s, d, e], [("v1", "add", ("u",), 2), ("v2", "floordiv", ("v1",), 2), ("v3", "mul", ("u",), 6), ("v4", "add", ("v3",), 1),
                                  ("v5", "mod", ("v4",), 3), ("v6", "floordiv", ("s", "d"), None), ("v7", "mod", ("s", "d"), None),
                                  ("v8", "floordiv", ("s", "e"), None), ("v9", "mod", ("s", "e"), None), ("v10", "floordiv", ("s",), 16),
                                  ("v11", "mod", ("s",), 4)], ["v2", "v5", "v6", "v7", "v8", "v9", "v10", "v11"])


@pytest.mark.parametrize("device", COMPUTE)
def test_wrapping_division_program(device: str) -> None:
  prog = _wrapping_division_program()
  want = reference_results(prog, "numpy")
  un = np.array(prog.inputs[0].data, dtype=np.uint8)
  sn = np.array([-9, -7, -1, 0, 1, 5, 7, 8, 9])
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(want["v2"], (un + np.uint8(2)) // np.uint8(2))
    np.testing.assert_array_equal(want["v5"], (un * np.uint8(6) + np.uint8(1)) % np.uint8(3))
  assert want["v2"][7] == 0 and want["v2"][8] == 0   # 254 + 2 and 255 + 2 wrap to 0 and 1
  # Python's own // and % are the specification
  np.testing.assert_array_equal(want["v6"], [x // y for x, y in zip(sn.tolist(), [3, 3, 2, 2, 4, 4, 5, 1, 1])])
  np.testing.assert_array_equal(want["v7"], [x % y for x, y in zip(sn.tolist(), [3, 3, 2, 2, 4, 4, 5, 1, 1])])
  np.testing.assert_array_equal(want["v8"], [x // -y for x, y in zip(sn.tolist(), [3, 3, 2, 2, 4, 4, 5, 1, 1])])
  np.testing.assert_array_equal(want["v9"], [x % -y for x, y in zip(sn.tolist(), [3, 3, 2, 2, 4, 4, 5, 1, 1])])
  np.testing.assert_array_equal(want["v10"], [x // 16 for x in sn.tolist()])
  np.testing.assert_array_equal(want["v11"], [x % 4 for x in sn.tolist()])
  if pf.torch_available():
    t = reference_results(prog, "torch")
    assert compare_results(prog, t, want) == []
  check_program(prog, device, default_settings(3, n_random=2), want=want)


def test_int_division_reproducer_runs() -> None:
  """A reproducer of an int division program is runnable code that checks the values (it passes on a correct run)."""
  prog = _wrapping_division_program()
  dev = COMPUTE[0]
  setting = OptSetting("heuristic+random", seed=11)
  run = run_program(prog, dev, setting)
  assert run.error is None
  want = reference_results(prog, "numpy")
  text = reproducer(prog, dev, setting, run, want)
  assert "v2 = v1 // 2" in text and "v9 = s % e" in text
  exec(compile(text, "reproducer.py", "exec"), {})
  broken = dict(want, v2=want["v2"] + np.uint8(1))
  with pytest.raises(AssertionError, match="v2"):
    exec(compile(reproducer(prog, dev, setting, run, broken), "reproducer.py", "exec"), {})
