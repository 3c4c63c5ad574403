"""The architecture contract, checked on the source (ast) so that CI catches a breach before any behaviour does.

1. Device packages (every package under packages/ but tiny-core and tiny-nn, and the test plugins under tests/plugins/) import from
   core only `tiny.backend` and `tiny.plugins`; modules whose job is to build programs the way a user does (op suites and
   self-tests: files named in USER_API_FILES) may also use the top-level user API (`from tiny import Tensor`). Every
   import counts, including ones inside functions and under TYPE_CHECKING.
2. Core is layered (LAYERS, low -> high): a module-level import (run at import time, so TYPE_CHECKING blocks and
   function bodies do not count) may not reach a higher layer. KNOWN_VIOLATIONS lists the debt that is being paid off;
   the test fails when a listed violation is gone, so the list only shrinks.

`python tests/test_architecture.py` prints the layering report and the number of function-level imports per core module.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE_SRC = ROOT / "packages" / "tiny-core" / "src"
# every package under packages/ is held to the device rule except core itself and the user-level library built on Tensor,
# so that a new device package is covered the day it appears
NOT_DEVICE_PACKAGES: FrozenSet[str] = frozenset({"tiny-core", "tiny-nn"})

ALLOWED_FOR_DEVICES: FrozenSet[str] = frozenset({"tiny.backend", "tiny.plugins"})
# op suites and self-tests build Tensors and schedules like a program does: they may use `from tiny import ...` (top level only)
USER_API_FILES: FrozenSet[str] = frozenset({"opsuite.py", "selftest.py", "__main__.py"})
USER_API_NAMES: FrozenSet[str] = frozenset({"Tensor", "TinyJit", "Device", "dtypes", "Variable", "Context", "GlobalCounters", "getenv"})

# Core's layers, low -> high; a module belongs to the layer of its longest matching prefix. Same-layer imports are fine.
LAYERS: Tuple[Tuple[str, ...], ...] = (
  ("tiny.helpers", "tiny.dtype", "tiny.capabilities"),       # no tiny imports of their own (capabilities: plain dataclass)
  ("tiny.shape",),
  ("tiny.ops", "tiny.codegen.uops"),
  ("tiny.codegen",),
  ("tiny.renderer",),
  ("tiny.plugins", "tiny.device", "tiny.registry", "tiny.runtime"),
  ("tiny.lazy", "tiny.eager_key", "tiny.multi"),       # below engine: the scheduler works on LazyBuffers; lazy reaches the engine only inside functions
  ("tiny.engine",),
  ("tiny.function", "tiny.tensor"),
  ("tiny.testing", "tiny.backend", "tiny.__main__", "tiny"),   # facades and tools: nothing in core may import them
)

# (importer, imported) module-level imports that go up a layer today. Each is debt: remove the entry when the import goes.
# Empty today: every upward dependency in core is a function-level import (see `python tests/test_architecture.py`).
# Add an entry only with a comment naming the issue that removes it; test_core_layering fails once it is gone.
KNOWN_VIOLATIONS: FrozenSet[Tuple[str, str]] = frozenset()


@dataclass(frozen=True)
class ImportRef:
  """One imported tiny module: `target` is the module (for `from tiny import x`, tiny.x when x is a module, else tiny)."""
  target: str
  names: Tuple[str, ...]
  line: int
  when: str               # "import" (runs at import time), "call" (in a function body) or "typing" (under `if TYPE_CHECKING:`)

  @property
  def module_level(self) -> bool:
    return self.when == "import"


def _core_modules() -> Set[str]:
  mods: Set[str] = set()
  for p in (CORE_SRC / "tiny").rglob("*.py"):
    parts = list(p.relative_to(CORE_SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    mods.add(".".join(parts))
  return mods


CORE_MODULES = _core_modules()


def _is_type_checking(test: ast.expr) -> bool:
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(node: ast.ImportFrom, modname: str, is_pkg: bool) -> Optional[str]:
  if node.level == 0:
    return node.module
  base = modname.split(".") if is_pkg else modname.split(".")[:-1]
  base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
  return ".".join(base + ([node.module] if node.module else []))


def tiny_imports(source: str, modname: str = "<src>", is_pkg: bool = False, filename: str = "<src>") -> List[ImportRef]:
  """Every import of a `tiny` or `tiny.*` module in source, with its line and whether it runs at import time."""
  tree = ast.parse(source, filename=filename)
  out: List[ImportRef] = []

  def visit(node: ast.AST, when: str) -> None:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        visit(child, "call" if when == "import" else when)
      elif isinstance(child, ast.If) and _is_type_checking(child.test):
        visit(ast.Module(body=child.body, type_ignores=[]), "typing")
        visit(ast.Module(body=child.orelse, type_ignores=[]), when)
      elif isinstance(child, ast.Import):
        for a in child.names:
          if a.name == "tiny" or a.name.startswith("tiny."):
            out.append(ImportRef(a.name, (), child.lineno, when))
      elif isinstance(child, ast.ImportFrom):
        mod = _resolve(child, modname, is_pkg)
        if mod is None or not (mod == "tiny" or mod.startswith("tiny.")):
          continue
        if mod == "tiny":   # `from tiny import plugins` imports the module tiny.plugins; `from tiny import Tensor` is the user API
          user = tuple(a.name for a in child.names if f"tiny.{a.name}" not in CORE_MODULES)
          out.extend(ImportRef(f"tiny.{a.name}", (), child.lineno, when) for a in child.names if f"tiny.{a.name}" in CORE_MODULES)
          if user:
            out.append(ImportRef("tiny", user, child.lineno, when))
        else:
          out.append(ImportRef(mod, tuple(a.name for a in child.names), child.lineno, when))
      else:
        visit(child, when)

  visit(tree, "import")
  return out


# ---- rule 1: device packages use tiny.backend and tiny.plugins only ----

def device_import_problems(source: str, filename: str) -> List[str]:
  """'file:line: why' for every tiny import in a device-package source file that breaks the contract."""
  problems = []
  user_api_ok = Path(filename).name in USER_API_FILES
  for ref in tiny_imports(source, filename=filename):
    if ref.target in ALLOWED_FOR_DEVICES:
      continue
    if ref.target == "tiny" and user_api_ok and ref.names and set(ref.names) <= USER_API_NAMES:
      continue
    what = f"from tiny import {', '.join(ref.names)}" if ref.target == "tiny" else ref.target
    hint = " (the user API is only for op-suite/self-test modules: " + ", ".join(sorted(USER_API_FILES)) + ")" if ref.target == "tiny" else ""
    problems.append(f"{filename}:{ref.line}: imports {what}; a device package may import only tiny.backend and tiny.plugins{hint}")
  return problems


def device_packages() -> List[Path]:
  return [p for p in sorted((ROOT / "packages").iterdir()) if p.is_dir() and p.name not in NOT_DEVICE_PACKAGES]


def device_sources() -> Iterator[Path]:
  for pkg in device_packages():
    yield from sorted((pkg / "src").rglob("*.py"))
  for src in sorted((ROOT / "tests" / "plugins").glob("*/src")):
    yield from sorted(src.rglob("*.py"))


def test_device_packages_import_only_the_backend_api() -> None:
  names = {p.name for p in device_packages()}
  assert {"tiny-clang", "tiny-cuda", "tiny-amd", "tiny-metal"} <= names, f"the device packages were not found: {sorted(names)}"
  files = list(device_sources())
  problems = [p for f in files for p in device_import_problems(f.read_text(), str(f.relative_to(ROOT)))]
  assert not problems, "device packages reach into core's private modules:\n" + "\n".join(problems)


# ---- rule 2: core's layers ----

def layer_of(module: str) -> int:
  """Index in LAYERS of the longest prefix of module (KeyError for a module outside every layer)."""
  best: Optional[Tuple[int, int]] = None
  for i, prefixes in enumerate(LAYERS):
    for p in prefixes:
      if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[0]):
        best = (len(p), i)
  if best is None:
    raise KeyError(f"{module} is in no layer of tests/test_architecture.py LAYERS")
  return best[1]


def layer_violations(source: str, modname: str, is_pkg: bool = False, filename: str = "<src>") -> List[Tuple[str, str, int]]:
  """(importer, imported, line) for every module-level import of a higher layer."""
  mine = layer_of(modname)
  return [(modname, ref.target, ref.line) for ref in tiny_imports(source, modname, is_pkg, filename)
          if ref.module_level and ref.target != modname and layer_of(ref.target) > mine]


def _core_files() -> Iterator[Tuple[str, bool, Path]]:
  for p in sorted((CORE_SRC / "tiny").rglob("*.py")):
    parts = list(p.relative_to(CORE_SRC).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    yield ".".join(parts[:-1] if is_pkg else parts), is_pkg, p


def core_layer_violations() -> Dict[Tuple[str, str], List[str]]:
  """{(importer, imported): ['file:line', ...]} over all of core."""
  found: Dict[Tuple[str, str], List[str]] = {}
  for mod, is_pkg, path in _core_files():
    for importer, imported, line in layer_violations(path.read_text(), mod, is_pkg, str(path)):
      found.setdefault((importer, imported), []).append(f"{path.relative_to(ROOT)}:{line}")
  return found


def function_level_imports() -> Counter[str]:
  """Per core module, the tiny imports inside function bodies (they run on first call, usually to break a cycle).
  Not enforced; the number is for the report, to watch the debt shrink."""
  counts: Counter[str] = Counter()
  for mod, is_pkg, path in _core_files():
    counts[mod] = sum(1 for r in tiny_imports(path.read_text(), mod, is_pkg) if r.when == "call")
  return counts


def test_every_core_module_has_a_layer() -> None:
  missing = []
  for mod in sorted(CORE_MODULES):
    try:
      layer_of(mod)
    except KeyError as e:
      missing.append(str(e))
  assert not missing, "\n".join(missing)


def layering_problems(found: Dict[Tuple[str, str], List[str]], known: FrozenSet[Tuple[str, str]]) -> List[str]:
  """New upward imports (file:line each), then listed violations that no longer occur (the list may only shrink)."""
  msgs = [f"{where}: {a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)}) at module level; import it inside the function "
          "that needs it, or move the code down a layer" for (a, b), ws in sorted(found.items()) if (a, b) not in known for where in ws]
  msgs += [f"KNOWN_VIOLATIONS entry {a} -> {b} no longer occurs: remove it from tests/test_architecture.py" for a, b in sorted(known - set(found))]
  return msgs


def test_core_layering() -> None:
  problems = layering_problems(core_layer_violations(), KNOWN_VIOLATIONS)
  assert not problems, "core's layering contract is broken:\n" + "\n".join(problems)


# ---- the backend facade itself ----

def test_backend_all_matches_its_table_and_resolves() -> None:
  import tiny.backend as backend
  assert list(backend.__all__) == list(dict.fromkeys(backend.__all__)), "duplicate names in tiny.backend.__all__"
  assert set(backend.__all__) == set(backend._LAZY), "tiny.backend.__all__ and its _LAZY table disagree"
  unresolved = []
  for name in backend.__all__:
    try:
      getattr(backend, name)
    except (AttributeError, ImportError) as e:
      unresolved.append(f"{name}: {e}")
  assert not unresolved, "\n".join(unresolved)
  with pytest.raises(AttributeError, match="not part of the backend API"):
    getattr(backend, "Kernel_does_not_exist")


def test_import_tiny_stays_light() -> None:
  # discovery is lazy: neither `import tiny` nor `import tiny.backend` may load the compiler, the engine or any plugin
  code = "import sys, tiny, tiny.backend; print(sorted(m for m in sys.modules if m.startswith('tiny')))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
  assert out == "['tiny', 'tiny.backend']", out


# ---- the checker can fail ----

BAD_PLUGIN = '''
from tiny.backend import Renderer
from tiny.plugins import hookimpl
from tiny.codegen.uops import UOps
import tiny.device
from tiny import Tensor
def f():
  from tiny.engine.jit import GraphRunner
'''


def test_checker_reports_private_imports() -> None:
  problems = device_import_problems(BAD_PLUGIN, "tiny_bad/renderer.py")
  assert [p.split(": ")[0] for p in problems] == ["tiny_bad/renderer.py:4", "tiny_bad/renderer.py:5", "tiny_bad/renderer.py:6",
                                                  "tiny_bad/renderer.py:8"], problems
  assert "tiny.codegen.uops" in problems[0] and "only for op-suite" in problems[2]
  # the user API is fine in an op suite, but private modules are not
  assert [p.split(": ")[0] for p in device_import_problems(BAD_PLUGIN, "tiny_bad/opsuite.py")] == \
    ["tiny_bad/opsuite.py:4", "tiny_bad/opsuite.py:5", "tiny_bad/opsuite.py:8"]
  assert device_import_problems("from tiny import plugins\nfrom tiny.backend import UOp\n", "x.py") == []


def test_checker_reports_layer_violations() -> None:
  src = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\nfrom tiny.helpers import prod\n"
         "from tiny.tensor import Tensor\nif TYPE_CHECKING:\n  from tiny.engine.realize import ExecItem\n"
         "def f():\n  from tiny.lazy import LazyBuffer\n")
  assert layer_violations(src, "tiny.ops") == [("tiny.ops", "tiny.tensor", 4)]
  assert layer_violations("from . import uops\nfrom ..engine import jit\n", "tiny.codegen.kernel") == [("tiny.codegen.kernel", "tiny.engine", 2)]
  assert layer_violations(src, "tiny.tensor") == []


def test_known_violations_only_shrink() -> None:
  found = {("tiny.ops", "tiny.tensor"): ["ops.py:4"]}
  assert layering_problems(found, frozenset({("tiny.ops", "tiny.tensor")})) == []
  assert [p.split(":")[0] for p in layering_problems(found, frozenset())] == ["ops.py"]
  gone = layering_problems({}, frozenset({("tiny.ops", "tiny.tensor")}))
  assert len(gone) == 1 and "no longer occurs" in gone[0]


def _report() -> None:
  for (a, b), where in sorted(core_layer_violations().items()):
    print(f"{'known' if (a, b) in KNOWN_VIOLATIONS else 'NEW  '} {a} -> {b}: {', '.join(where)}")
  print("function-level tiny imports per core module:")
  for mod, n in function_level_imports().most_common():
    if n:
      print(f"  {n:3d} {mod}")


if __name__ == "__main__":
  _report()
