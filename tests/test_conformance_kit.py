"""The conformance kit (`pytest --tiny-device=NAME --tiny-conformance`) as a third party uses it: from a directory
outside the repo, in a fresh process. It passes on PYTHON and on the pip-installed EXAMPLE plugin, and it fails on a
device whose renderer miscompiles float ADD as SUB (so the kit can fail)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KIT_ARGS = ["--tiny-conformance", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly"]

# A plugin module registered in-process with tiny.plugins.register: PYTHON's classes, with an optional miscompile.
DEVICE_PLUGIN = '''
import base64, pickle
from tiny.plugins import DeviceSpec, hookimpl

TINY_PLUGIN_API = "1.1"
MISCOMPILE = {miscompile}

def _renderer(device):
  from tiny.codegen.uops import UOps
  from tiny.dtype import dtypes
  from tiny.ops import BinaryOps, UnaryOps
  from tiny.runtime.ops_python import PythonRenderer, deserialize_uops

  class AddIsSubRenderer(PythonRenderer):
    def render(self, name, uops):
      rows = deserialize_uops(super().render(name, uops))
      if MISCOMPILE:   # every float a+b becomes a+(-b); index arithmetic (ints) stays right
        bad = [op is UOps.ALU and arg is BinaryOps.ADD and dtypes.is_float(dt) for op, dt, src, arg in rows]
        pos, shift = [], 0
        for b in bad:   # new position of every row once a NEG is inserted before each bad ADD
          shift += b
          pos.append(len(pos) + shift)
        out = []
        for (op, dt, src, arg), b in zip(rows, bad):
          src = tuple(pos[s] for s in src)
          if b:
            out.append((UOps.ALU, dt, (src[1],), UnaryOps.NEG))
            src = (src[0], len(out) - 1)
          out.append((op, dt, src, arg))
        rows = out
      return base64.b64encode(pickle.dumps(rows)).decode()
  return AddIsSubRenderer()

def _python(attr, call=True):
  def factory(device):
    from tiny.runtime import ops_python
    obj = getattr(ops_python, attr)
    return obj() if call else obj
  return factory

@hookimpl
def tiny_devices():
  return [DeviceSpec(name="{name}", allocator=_python("PythonAllocator"), renderer=_renderer, compiler=_python("PythonCompiler"),
                     runtime=_python("PythonProgram", call=False), priority=-1)]
'''


def _env() -> dict:
  env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
  env["HYPOTHESIS_PROFILE"] = "default"   # this file checks the kit's mechanics, not fuzzing depth
  return env


def _pytest(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "pytest", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _summary(proc: subprocess.CompletedProcess) -> str:
  return f"exit {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-6000:]}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"


def _count(proc: subprocess.CompletedProcess, what: str) -> int:
  """The number before `what` ("passed", "deselected") in pytest's summary line, 0 when absent."""
  line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
  parts = [p.strip() for p in line.split(" in ")[0].split(",")]
  return next((int(p.split()[0]) for p in parts if p.endswith(f" {what}")), 0)


# CI proves the compiled CPU device with the whole kit (about 105 s on 2 cores with a cold compile cache, 20 s warm)
# and the two interpreted devices with the quick subset (a few seconds each; the whole kit takes ~50 s there)
# and the OpenCL device (tiny-opencl on PoCL in CI: the GPU half of the codegen, locals and barriers) with the whole kit
# and HCQCPU (tiny-clang's reference of the HCQ interfaces: CLANG kernels through queues, signals and HCQGraph) quick
@pytest.mark.parametrize("device,quick", [("CLANG", False), ("PYTHON", True), ("EXAMPLE", True), ("GPU", False), ("HCQCPU", True)],
                         ids=["CLANG-full", "PYTHON-quick", "EXAMPLE-quick", "GPU-full", "HCQCPU-quick"])
def test_kit_passes(device, quick, tmp_path):
  from tiny.dtype import DTYPES_DICT
  from tiny.registry import Device
  if device in ("EXAMPLE", "GPU") and device not in Device._devices:
    plugin = {"EXAMPLE": "tests/plugins/tiny-example", "GPU": "packages/tiny-opencl"}[device]
    pytest.skip(f"the plugin providing {device} is not pip-installed (pip install -e {plugin})")
  if (reason := Device.availability(device)) is not None:
    pytest.skip(f"{device} is not available here: {reason}")
  skip: list = []
  if device == "GPU":   # an OpenCL device has no bfloat16, and half or double only with their extensions
    from tiny_opencl.plugin import supported_dtypes
    have = supported_dtypes(device)
    skip = [f"--tiny-skip-dtypes={','.join(sorted(n for n, dt in DTYPES_DICT.items() if dt not in have))}"]
  proc = _pytest(tmp_path, f"--tiny-device={device}", *KIT_ARGS, *skip, *(["--tiny-quick"] if quick else []), timeout=1200)
  assert proc.returncode == 0, _summary(proc)
  assert " passed" in proc.stdout and " failed" not in proc.stdout, _summary(proc)
  passed, deselected = _count(proc, "passed"), _count(proc, "deselected")
  if quick:   # a real subset: well over a hundred tests from every module, most of the kit left out
    assert 80 <= passed < deselected, _summary(proc)
  else:   # the kit is substantial: hundreds of tests, all modules collected from the installed package; a device
    # without some dtypes skips their tests, but most of the kit still has to run
    assert passed >= 600 and passed + _count(proc, "skipped") >= 700 and deselected == 0, _summary(proc)


def _collected(proc: subprocess.CompletedProcess) -> list:
  return [ln.strip() for ln in proc.stdout.splitlines() if "::" in ln]


def test_quick_subset_covers_every_kit_module(tmp_path):
  """--tiny-quick keeps at least one test of every kit module (a new module must mark some tests kit_quick), keeps
  the user's own tests given next to the kit, and leaves out most of the kit."""
  from tiny.testing.pytest_plugin import conformance_dir
  (tmp_path / "test_own.py").write_text("def test_own():\n  assert 1 + 1 == 2\n")
  full = _pytest(tmp_path, "--tiny-device=PYTHON", *KIT_ARGS, "--co")
  quick = _pytest(tmp_path, "--tiny-device=PYTHON", *KIT_ARGS, "--tiny-quick", "--co", "test_own.py")
  assert full.returncode == 0 and quick.returncode == 0, _summary(full) + _summary(quick)
  full_ids, quick_ids = _collected(full), _collected(quick)
  assert any(i.endswith("test_own.py::test_own") for i in quick_ids), "--tiny-quick deselected a test outside the kit\n" + _summary(quick)
  kit_quick = [i for i in quick_ids if "test_own.py" not in i]
  assert set(kit_quick) <= set(full_ids) and 3 * len(kit_quick) < len(full_ids), _summary(quick)
  modules = sorted(p.name for p in conformance_dir().glob("test_kit_*.py"))
  missing = [m for m in modules if not any(i.startswith(m + "::") or f"/{m}::" in i for i in kit_quick)]
  assert not missing, f"kit modules with no test in the quick subset (mark some with @pytest.mark.kit_quick): {missing}"


def _run_registered(tmp_path: Path, name: str, miscompile: bool, *args: str) -> subprocess.CompletedProcess:
  (tmp_path / f"plugin_{name.lower()}.py").write_text(DEVICE_PLUGIN.format(name=name, miscompile=miscompile))
  code = textwrap.dedent(f"""
    import sys
    import pytest
    import tiny.plugins
    import plugin_{name.lower()} as mod
    tiny.plugins.register(mod)
    sys.exit(pytest.main({[f"--tiny-device={name}", *KIT_ARGS, *args]!r}))
  """)
  env = _env()
  env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_kit_fails_on_a_miscompiling_device(tmp_path):
  subset = ["-k", "broadcast or test_binary or test_same_as_python"]
  good = _run_registered(tmp_path, "GOODTWIN", False, *subset)
  assert good.returncode == 0, "the correct twin of the broken device must pass:\n" + _summary(good)
  bad = _run_registered(tmp_path, "ADDISSUB", True, *subset)
  assert bad.returncode == 1, "the kit must fail on a device that computes a+b as a-b:\n" + _summary(bad)
  assert "FAILED" in bad.stdout and "Mismatched elements" in bad.stdout, _summary(bad)
  failed = [ln for ln in bad.stdout.splitlines() if ln.startswith("FAILED")]
  assert any("add-float" in ln for ln in failed), "float add must be among the failures:\n" + "\n".join(failed)
  assert not any("mul-int32" in ln or "xor" in ln for ln in failed), "ops not using float ADD must still pass:\n" + "\n".join(failed)


def test_unknown_device_is_a_usage_error(tmp_path):
  proc = _pytest(tmp_path, "--tiny-device=NOSUCHDEVICE", *KIT_ARGS)
  assert proc.returncode == 4, _summary(proc)   # pytest's usage-error exit code
  assert "--tiny-device=NOSUCHDEVICE" in proc.stderr and "unknown device" in proc.stderr, _summary(proc)


PLAIN_TESTS = '''
import sys
import pytest

def test_plugin_loaded_but_tiny_not_imported(pytestconfig):
  assert pytestconfig.pluginmanager.has_plugin("tiny"), "the pytest11 entry point of tiny-core is not active"
  heavy = [m for m in ("tiny.tensor", "tiny.registry", "tiny.plugins", "tiny.lazy") if m in sys.modules]
  assert not heavy, f"loading the plugin imported {heavy}"
'''

DEVICE_TESTS = '''
import numpy as np
import pytest

def test_fixture_and_default(tiny_device):
  from tiny import Tensor
  from tiny.registry import Device
  assert tiny_device == "PYTHON" and Device.DEFAULT == "PYTHON"
  t = Tensor([1.0, 2.0]) * 3
  assert t.device == "PYTHON"
  np.testing.assert_allclose(t.numpy(), [3.0, 6.0])

@pytest.mark.needs_device("NOSUCHDEVICE")
def test_needs_missing_device():
  raise AssertionError("must be skipped")

@pytest.mark.needs_device("PYTHON")
def test_needs_python():
  pass
'''


def test_plugin_is_free_when_unused(tmp_path):
  (tmp_path / "test_plain_user.py").write_text(PLAIN_TESTS)
  proc = _pytest(tmp_path, "-q", "-p", "no:cacheprovider", "-p", "no:xdist")
  assert proc.returncode == 0 and "1 passed" in proc.stdout, _summary(proc)


def test_device_option_fixture_and_marker(tmp_path):
  (tmp_path / "test_device_user.py").write_text(DEVICE_TESTS)
  proc = _pytest(tmp_path, "--tiny-device=python", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist")
  assert proc.returncode == 0, _summary(proc)
  assert "tiny device under test: PYTHON" in proc.stdout, _summary(proc)   # the header names the canonical device
  assert "2 passed, 1 skipped" in proc.stdout, _summary(proc)
  assert "NOSUCHDEVICE is not available here" in proc.stdout, _summary(proc)


def test_skip_dtypes_option(tmp_path):
  proc = _pytest(tmp_path, "--tiny-device=PYTHON", *KIT_ARGS, "--tiny-skip-dtypes=float64,uint64", "-rs", "-k", "test_roundtrip")
  assert proc.returncode == 0, _summary(proc)
  skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
  assert len(skipped) == 2 and all("excluded for PYTHON by --tiny-skip-dtypes" in ln for ln in skipped), _summary(proc)
  bad = _pytest(tmp_path, "--tiny-device=PYTHON", *KIT_ARGS, "--tiny-skip-dtypes=float65", "-k", "test_roundtrip")
  assert bad.returncode != 0 and "unknown dtype 'float65'" in (bad.stdout + bad.stderr), _summary(bad)


def test_kit_alongside_explicit_paths(tmp_path):
  """With paths on the command line the kit is added to them, not substituted for them."""
  (tmp_path / "test_own.py").write_text("def test_own():\n  assert 1 + 1 == 2\n")
  proc = _pytest(tmp_path, "--tiny-device=PYTHON", *KIT_ARGS, "test_own.py", "-k", "test_own or test_roundtrip_sizes")
  assert proc.returncode == 0 and "2 passed" in proc.stdout, _summary(proc)
