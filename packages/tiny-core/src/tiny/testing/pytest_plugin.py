"""tiny's pytest plugin (entry point ``pytest11: tiny``): choose the device under test and run the conformance kit.

```
pytest --tiny-device=MYCHIP --tiny-conformance        # prove a device package, from any directory
pytest --tiny-device=CLANG tests/                     # run a project's own tests on CLANG
pytest --tiny-device=METAL --tiny-conformance --tiny-skip-dtypes=float64,bfloat16
pytest --tiny-device=MYCHIP --tiny-conformance --tiny-quick   # a representative subset, well under a minute on a CPU device
```

Options:
  --tiny-device=NAME      the device under test: Device.DEFAULT for the whole session (also exported as DEVICE=NAME,
                          so subprocesses and plugin resets keep it) and the value of the ``tiny_device`` fixture.
  --tiny-conformance      collect the conformance suite shipped in ``tiny.testing.conformance``; without paths on the
                          command line only the kit runs, with paths the kit runs in addition to them.
  --tiny-skip-dtypes=a,b  dtypes the device does not support; kit tests needing them skip with that reason.
  --tiny-quick            run only the kit's quick subset: kit tests without the ``kit_quick`` marker are deselected and the
                          hypothesis tests draw fewer examples. Without it the whole kit runs.

Markers:
  ``@pytest.mark.needs_device("CUDA")`` skips a test, with the device probe's reason, where CUDA cannot run.
  ``@pytest.mark.kit_quick`` puts a kit test in the quick subset; it works on a test, on a ``pytest.param`` of a
  parametrized test (only that case is quick) and on a whole module (``pytestmark = pytest.mark.kit_quick``). Kit
  modules pass their hypothesis example counts through ``tiny.testing.conformance._kit.examples(n)`` (see
  ``quick_mode()``) so a quick run also draws fewer examples. Tests outside the kit folder are never deselected.

Loading this plugin is free for projects that do not use it: tiny itself is imported only when an option or the
marker is used.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional

import pytest

_KIT_PACKAGE = "tiny.testing.conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("tiny", "tiny device testing")
  group.addoption("--tiny-device", action="store", default=None, metavar="NAME",
                  help="run the tests on this tiny device (sets Device.DEFAULT and the tiny_device fixture)")
  group.addoption("--tiny-conformance", action="store_true", default=False,
                  help="collect tiny's conformance suite (tiny.testing.conformance) for the device under test")
  group.addoption("--tiny-skip-dtypes", action="store", default="", metavar="DTYPES",
                  help="comma-separated dtype names the device does not support (float64,bfloat16,...); kit tests skip them")
  group.addoption("--tiny-quick", action="store_true", default=False,
                  help="run only the conformance kit's quick subset (tests marked kit_quick, fewer hypothesis examples)")


def conformance_dir() -> Path:
  """The folder of the conformance test modules inside the installed tiny package (found without importing tiny)."""
  import importlib.util
  spec = importlib.util.find_spec(_KIT_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise pytest.UsageError(f"--tiny-conformance: the package {_KIT_PACKAGE} is missing from this tiny-core install")
  return Path(list(spec.submodule_search_locations)[0])


def _select_device(name: str) -> str:
  """Make name the default device, or stop the run with the reason it cannot be used."""
  from tiny.registry import Device, DeviceError
  try:
    canonical = Device.canonicalize(name)
    Device[canonical]
  except DeviceError as e:
    raise pytest.UsageError(f"--tiny-device={name}: {e}") from None
  os.environ["DEVICE"] = canonical
  Device.DEFAULT = canonical
  return canonical


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "needs_device(name): skip (with the device probe's reason) where the tiny device cannot run")
  config.addinivalue_line("markers", "tiny_conformance: a test of tiny's device conformance kit")
  config.addinivalue_line("markers", "kit_quick: a conformance kit test (or parametrized case) that --tiny-quick runs")
  global _quick
  _quick = bool(config.getoption("tiny_quick", False))
  if (name := config.getoption("tiny_device", None)) is not None:
    config.stash[_device_key] = _select_device(name)
  if config.getoption("tiny_conformance", False):
    kit = str(conformance_dir())
    if config.args_source == pytest.Config.ArgsSource.ARGS:
      if kit not in config.args:
        config.args.append(kit)
    else:   # no paths given: run the kit alone, not testpaths or the current directory
      config.args[:] = [kit]


def pytest_unconfigure(config: pytest.Config) -> None:
  global _quick
  _quick = False


_device_key = pytest.StashKey[str]()
# --tiny-quick of the running session: a module global because kit modules read it at import (hypothesis settings)
_quick = False


def quick_mode() -> bool:
  """True while pytest runs with --tiny-quick: kit tests then keep their example counts and sizes small."""
  return _quick


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
  if not config.getoption("tiny_quick", False):
    return
  kit = conformance_dir().resolve()
  keep: List[pytest.Item] = []
  drop: List[pytest.Item] = []
  for item in items:
    in_kit = kit in Path(item.path).resolve().parents
    (drop if in_kit and item.get_closest_marker("kit_quick") is None else keep).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _device_reason(name: str) -> Optional[str]:
  from tiny.registry import Device, DeviceError
  try:
    return Device.availability(name)
  except DeviceError as e:
    return str(e).splitlines()[0]


def pytest_runtest_setup(item: pytest.Item) -> None:
  for mark in item.iter_markers("needs_device"):
    if not mark.args or not isinstance(mark.args[0], str):
      raise pytest.UsageError(f"{item.nodeid}: needs_device takes a device name, e.g. @pytest.mark.needs_device('CLANG')")
    if (reason := _device_reason(mark.args[0])) is not None:
      pytest.skip(f"device {mark.args[0]} is not available here: {reason}")


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
  lines = []
  if _device_key in config.stash:
    lines.append(f"tiny device under test: {config.stash[_device_key]}")
  if config.getoption("tiny_conformance", False):
    lines.append(f"tiny conformance kit: {conformance_dir()}")
  return lines or None


@pytest.fixture(scope="session")
def tiny_device(pytestconfig: pytest.Config) -> str:
  """The name of the device under test: --tiny-device, else tiny's default device."""
  if _device_key in pytestconfig.stash:
    return pytestconfig.stash[_device_key]
  from tiny.registry import Device
  return Device.DEFAULT


@pytest.fixture(scope="session")
def tiny_skip_dtypes(pytestconfig: pytest.Config) -> List[Any]:
  """The DTypes named by --tiny-skip-dtypes."""
  from tiny.dtype import DTYPES_DICT
  out = []
  for n in (x.strip() for x in pytestconfig.getoption("tiny_skip_dtypes", "").split(",")):
    if not n:
      continue
    if n not in DTYPES_DICT:
      raise pytest.UsageError(f"--tiny-skip-dtypes: unknown dtype {n!r}; known: {', '.join(sorted(DTYPES_DICT))}")
    out.append(DTYPES_DICT[n])
  return out


@pytest.fixture
def tiny_require_dtype(tiny_skip_dtypes: List[Any], tiny_device: str) -> Any:
  """A function: tiny_require_dtype(dt, *more) skips the test when one of the dtypes is excluded for the device."""
  def check(*dts: Any) -> None:
    for dt in dts:
      if dt in tiny_skip_dtypes:
        pytest.skip(f"{dt} is excluded for {tiny_device} by --tiny-skip-dtypes")
  return check
