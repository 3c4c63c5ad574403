"""Discovery through real entry points, in fresh interpreters.

The plugin packages under tests/plugins/ are put on PYTHONPATH of a subprocess together with a dist-info folder
written from their pyproject.toml, which is exactly what importlib.metadata reads for an installed distribution.
That way the broken plugins never land in the environment the rest of the suite runs in.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterable, Optional

import pytest

from tiny.plugins import PLUGIN_API_VERSION

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")

REPO = Path(__file__).resolve().parents[3]
PLUGINS = REPO / "tests" / "plugins"


def install_into(site: Path, project: Path) -> None:
  """Make `project` (a src-layout package) importable from `site`, with the metadata and entry points pip would write."""
  meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
  for pkg in (project / "src").iterdir():
    shutil.copytree(pkg, site / pkg.name)
  info = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
  info.mkdir()
  (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n")
  eps = meta.get("entry-points", {})
  (info / "entry_points.txt").write_text("".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) for group, items in eps.items()))


def write_project(root: Path, name: str, entry: str, module: str, source: str) -> Path:
  """A throw-away plugin project in the same layout as the ones under tests/plugins/."""
  proj = root / name
  pkg = proj / "src" / module.split(".")[0]
  pkg.mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / f"{module.split('.')[1]}.py").write_text(textwrap.dedent(source))
  (proj / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.3.0"\n[project.entry-points.tiny]\n{entry} = "{module}"\n')
  return proj


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
  """example + broken + wrongapi, as installed distributions."""
  site = tmp_path_factory.mktemp("site")
  for name in ("tiny-example", "tiny-broken", "tiny-wrongapi"):
    install_into(site, PLUGINS / name)
  return site


def run(code: Optional[str], site: Path, env: Optional[Dict[str, str]] = None, args: Iterable[str] = ()) -> subprocess.CompletedProcess:
  e = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "TINY_STRICT_PLUGINS", "TINY_DISABLE_PLUGINS", "PYTHONPATH")}
  e["PYTHONPATH"] = str(site)
  e.update(env or {})
  cmd = [sys.executable, *(["-c", code] if code is not None else []), *args]
  return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=120)


def test_import_tiny_is_light(site: Path) -> None:
  code = "import sys, tiny; print(tiny.__version__); print(sorted(m for m in sys.modules if m.startswith(('tiny', 'pluggy'))))"
  r = run(code, site)
  assert r.returncode == 0, r.stderr
  version, mods = r.stdout.splitlines()
  assert version == "0.1.0"
  assert mods == "['tiny']"   # no plugin discovery, no pluggy, no broken plugin imported


def test_import_tiny_survives_strict_mode(site: Path) -> None:
  r = run("import tiny; print('ok')", site, {"TINY_STRICT_PLUGINS": "1"})
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_doctor_shows_both_errors(site: Path) -> None:
  r = run(None, site, args=["-m", "tiny", "doctor"])
  out = r.stdout
  assert "Traceback" not in r.stderr, r.stderr
  assert "entry point broken = tiny_broken.plugin [tiny-broken 0.1.0]" in out
  assert "ERROR: import failed: RuntimeError: tiny-broken fails on import on purpose" in out
  assert "entry point wrongapi = tiny_wrongapi.plugin [tiny-wrongapi 0.1.0] API 2.0" in out
  assert "built for tiny plugin API 2.0" in out and f"provides plugin API {PLUGIN_API_VERSION}" in out and "pip install --upgrade tiny-core" in out
  assert "entry point example = tiny_example.plugin [tiny-example 0.1.0] API 1.1" in out
  assert "provides: EXAMPLE, renderer EXAMPLE:ALT" in out
  assert "default device:" in out


def test_doctor_verbose_shows_the_traceback(site: Path) -> None:
  r = run(None, site, args=["-m", "tiny", "doctor", "-v"])
  assert 'raise RuntimeError("tiny-broken fails on import on purpose")' in r.stdout


ASK = """
from tiny import Device
for name in ("BROKEN", "WRONGAPI", "EXAMPLE"):
  try:
    Device.renderer(name)
    print(name, "ok")
  except Exception as e:
    print(name, type(e).__name__, repr(str(e)))
"""


def test_asking_for_failed_plugins_devices_is_a_clear_error(site: Path) -> None:
  r = run(ASK, site)
  assert r.returncode == 0, r.stderr
  rows = {line.split()[0]: line for line in r.stdout.splitlines()}
  assert rows["BROKEN"].startswith("BROKEN UnknownDeviceError")
  assert "plugin broken (tiny-broken 0.1.0), which failed: import failed: RuntimeError: tiny-broken fails on import" in rows["BROKEN"]
  assert rows["WRONGAPI"].startswith("WRONGAPI UnknownDeviceError") and "built for tiny plugin API 2.0" in rows["WRONGAPI"]
  assert rows["EXAMPLE"] == "EXAMPLE ok" or "ops_python" in rows["EXAMPLE"]   # EXAMPLE itself is discovered either way


def test_disable_plugins(site: Path) -> None:
  code = "from tiny import Device, plugins; print(sorted(Device._devices)); print([r.name for r in plugins.plugin_records() if r.error])"
  r = run(code, site, {"TINY_DISABLE_PLUGINS": "broken, tiny-wrongapi,EXAMPLE"})
  assert r.returncode == 0, r.stderr
  devices, errors = r.stdout.splitlines()
  assert "EXAMPLE" not in devices and "PYTHON" in devices
  assert "broken" not in errors and "wrongapi" not in errors
  d = run(None, site, {"TINY_DISABLE_PLUGINS": "broken"}, args=["-m", "tiny", "doctor"]).stdout
  assert "disabled by TINY_DISABLE_PLUGINS" in d and "tiny-broken fails on import" not in d


def test_strict_mode_is_fatal_on_first_use(site: Path) -> None:
  r = run("from tiny import Device; Device._devices", site, {"TINY_STRICT_PLUGINS": "1"})
  assert r.returncode != 0
  assert "PluginError" in r.stderr and "tiny-broken" in r.stderr


def test_two_plugins_claiming_one_device(tmp_path: Path) -> None:
  dupe = write_project(tmp_path / "src", "tiny-dupe", "dupe", "tiny_dupe.plugin", """
    from tiny.plugins import DeviceSpec, hookimpl
    TINY_PLUGIN_API = "1.1"
    def _f(device):
      raise AssertionError("never built")
    @hookimpl
    def tiny_devices():
      return [DeviceSpec(name="EXAMPLE", allocator=_f, renderer=_f, compiler=_f, runtime=_f)]
  """)
  site = tmp_path / "site"
  site.mkdir()
  install_into(site, PLUGINS / "tiny-example")
  install_into(site, dupe)
  r = run("from tiny import Device\ntry:\n  Device['EXAMPLE']\nexcept Exception as e:\n  print(type(e).__name__, str(e).splitlines()[0])", site)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("DeviceUnavailableError")
  assert "claimed by two plugins: dupe (tiny-dupe 0.3.0) and example (tiny-example 0.1.0)" in r.stdout
  d = run(None, site, args=["-m", "tiny", "doctor"]).stdout
  assert d.count("claimed by two plugins") >= 2   # both plugins show the conflict


def test_a_raising_hook_hides_no_other_plugin(tmp_path: Path) -> None:
  bad = write_project(tmp_path / "src", "tiny-badhook", "badhook", "tiny_badhook.plugin", """
    from tiny.plugins import hookimpl
    TINY_PLUGIN_API = "1.1"
    @hookimpl
    def tiny_devices():
      raise KeyError("hook bug")
  """)
  site = tmp_path / "site"
  site.mkdir()
  install_into(site, bad)
  install_into(site, PLUGINS / "tiny-example")
  r = run("from tiny import Device, plugins; print('EXAMPLE' in Device._devices); print([r.error for r in plugins.plugin_records() if r.error])", site)
  assert r.returncode == 0, r.stderr
  found, errors = r.stdout.splitlines()
  assert found == "True" and "hook tiny_devices raised: KeyError: 'hook bug'" in errors


# ---- plugins that end the process, hang, or lie about their specs ----

def _site_with(tmp_path: Path, name: str, body: str) -> Path:
  """A site with the example plugin and one throw-away plugin whose module source is body."""
  proj = write_project(tmp_path / "src", f"tiny-{name}", name, f"tiny_{name}.plugin", body)
  site = tmp_path / "site"
  site.mkdir()
  install_into(site, PLUGINS / "tiny-example")
  install_into(site, proj)
  return site


_SPEC = """
    import sys, time
    from tiny.plugins import DeviceSpec, hookimpl
    TINY_PLUGIN_API = "1.1"
    def _f(device):
      raise AssertionError("never built")
"""

_USE = ("from tiny import Device, plugins\nprint(Device.DEFAULT)\nprint('EXAMPLE' in Device._devices)\n"
        "print([r.error for r in plugins.plugin_records() if r.error])")


@pytest.mark.parametrize("where,code", [
  ("import", "sys.exit(3)"),
  ("import", "raise SystemExit('bye')"),
  ("hook", "@hookimpl\ndef tiny_devices():\n  sys.exit(4)"),
  ("hook", "@hookimpl\ndef tiny_devices():\n  raise GeneratorExit()"),
  ("probe", "@hookimpl\ndef tiny_devices():\n  return [DeviceSpec(name='EXITER', allocator=_f, renderer=_f, compiler=_f, runtime=_f, priority=999,"
            " probe=lambda: sys.exit(5))]"),
  ("factory", "def _exit(device):\n  sys.exit(6)\n@hookimpl\ndef tiny_devices():\n  return [DeviceSpec(name='EXITER', allocator=_f, renderer=_f,"
              " compiler=_f, runtime=_f, priority=999, device_factory=_exit)]"),
])
def test_a_plugin_cannot_end_the_process(tmp_path: Path, where: str, code: str) -> None:
  site = _site_with(tmp_path, "exiter", _SPEC + textwrap.indent(code, "    "))
  r = run(_USE, site)
  assert r.returncode == 0, f"the plugin's {where} ended the process: rc={r.returncode}\n{r.stderr}"
  default, found, errors = r.stdout.splitlines()
  assert default != "EXITER" and found == "True"
  if where in ("import", "hook"):
    assert "exiter" in errors.lower() or "SystemExit" in errors or "GeneratorExit" in errors, errors
  d = run(None, site, args=["-m", "tiny", "doctor"])
  assert "default device:" in d.stdout, d.stderr


def test_a_hanging_probe_or_hook_is_reported_not_waited_for(tmp_path: Path) -> None:
  site = _site_with(tmp_path, "sleeper", _SPEC + """
    @hookimpl
    def tiny_devices():
      return [DeviceSpec(name="SLEEPER", allocator=_f, renderer=_f, compiler=_f, runtime=_f, priority=999, probe=lambda: time.sleep(600))]
    @hookimpl
    def tiny_renderers():
      time.sleep(600)
  """)
  r = run(_USE + "\nprint(Device.availability('SLEEPER'))", site, {"TINY_PLUGIN_TIMEOUT": "0.5"})
  assert r.returncode == 0, r.stderr
  default, found, errors, why = r.stdout.splitlines()
  assert default != "SLEEPER" and found == "True"
  assert "hook tiny_renderers hung" in errors and "did not return within 0.5 s" in errors
  assert "probe of device SLEEPER did not return within 0.5 s" in why
  d = run(None, site, {"TINY_PLUGIN_TIMEOUT": "0.5"}, args=["-m", "tiny", "doctor"]).stdout
  assert "SLEEPER" in d and "did not return within" in d


@pytest.mark.parametrize("field,value,complaint", [
  ("priority", "'high'", "priority must be an int"),
  ("priority", "True", "priority must be an int"),
  ("probe", "'yes'", "probe must be callable"),
  ("graph", "42", "graph must be callable or None"),
  ("allocator", "None", "allocator must be callable"),
])
def test_bad_device_specs_are_refused_at_registration(tmp_path: Path, field: str, value: str, complaint: str) -> None:
  kw = dict(allocator="_f", renderer="_f", compiler="_f", runtime="_f")
  kw[field] = value
  args = ", ".join(f"{k}={v}" for k, v in kw.items())
  site = _site_with(tmp_path, "liar", _SPEC + f"""
    @hookimpl
    def tiny_devices():
      return [DeviceSpec(name="LIAR", {args})]
  """)
  r = run(_USE + "\nprint(Device.get_available_devices())", site)
  assert r.returncode == 0, r.stderr
  default, found, errors, avail = r.stdout.splitlines()
  assert default != "LIAR" and found == "True" and "LIAR" not in avail
  assert complaint in errors


def test_claiming_a_taken_name_warns_at_runtime(tmp_path: Path) -> None:
  site = _site_with(tmp_path, "thief", _SPEC + """
    @hookimpl
    def tiny_devices():
      return [DeviceSpec(name="EXAMPLE", allocator=_f, renderer=_f, compiler=_f, runtime=_f)]
  """)
  r = run("import warnings\nwarnings.simplefilter('default')\nfrom tiny import Device\nDevice.DEFAULT\nDevice.DEFAULT", site)
  assert r.returncode == 0, r.stderr
  assert r.stderr.count("RuntimeWarning") == 1 and "device 'EXAMPLE' is claimed by two plugins" in r.stderr
