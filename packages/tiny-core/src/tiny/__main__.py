"""Command line: ``python -m tiny doctor [-v]`` tells what tiny sees on this machine.

A plugin module may define ``doctor_notes() -> List[str]``: doctor prints those lines under the plugin (a fallback it had
to take, which toolchain it found). It is a plain function, not a hook, and it is only called here.
"""
from __future__ import annotations

import argparse
import platform
import sys
from typing import List, Optional, TextIO


def plugin_notes(module_name: str) -> List[str]:
  """The lines the plugin module's optional ``doctor_notes()`` gives; a note that fails is reported as one line."""
  module = sys.modules.get(module_name)   # discovery imported every plugin that loaded
  fn = getattr(module, "doctor_notes", None)
  if not callable(fn):
    return []
  try:
    return [str(x) for x in fn()]
  except Exception as e:   # a plugin's diagnostics must not stop the report: the failure is the note
    return [f"doctor_notes() raised {type(e).__name__}: {e}"]


def doctor(verbose: bool = False, out: TextIO = sys.stdout) -> int:
  """Print versions, every plugin found (and its load error), every device (available or why not) and the default.
  Returns 0 when a default device could be chosen, else 1."""
  import pluggy

  from tiny import plugins
  from tiny.registry import Device

  def p(line: str = "") -> None:
    print(line, file=out)

  try:
    import numpy
    numpy_version = numpy.__version__
  except ImportError:
    numpy_version = "missing"
  p(f"tiny-core {plugins.core_version()} (plugin API {plugins.PLUGIN_API_VERSION})")
  p(f"python {platform.python_version()} on {platform.system()} {platform.machine()}, numpy {numpy_version}, pluggy {pluggy.__version__}")
  p()
  try:
    records = plugins.plugin_records()
  except plugins.PluginError as e:   # TINY_STRICT_PLUGINS
    p(f"plugin discovery failed (TINY_STRICT_PLUGINS is set): {e}")
    return 1
  p(f"plugins ({len(records)}):")
  for rec in records:
    where = "core builtin" if rec.source == "builtin" else f"entry point {rec.name} = {rec.value}" if rec.source == "entry-point" \
      else f"registered module {rec.value}"
    dist = f"{rec.distribution} {rec.version or '?'}" if rec.distribution else "no distribution"
    p(f"  {rec.name}: {where} [{dist}]" + (f" API {rec.api}" if rec.api else ""))
    if rec.disabled:
      p("    disabled by TINY_DISABLE_PLUGINS")
    if rec.devices or rec.renderers:
      p(f"    provides: {', '.join(rec.devices + [f'renderer {r}' for r in rec.renderers])}")
    if rec.error:
      p(f"    ERROR: {rec.error}")
      if rec.traceback:
        tb = rec.traceback.rstrip().splitlines()
        for line in tb if verbose else tb[-3:]:
          p(f"      {line}")
    for w in rec.warnings:
      first, *rest = w.splitlines()
      p(f"    warning: {first}")
      for line in rest if verbose else []:
        p(f"      {line}")
    if not rec.error and not rec.disabled:
      for note in plugin_notes(rec.value):
        p(f"    note: {note}")
  p()
  entries = plugins.device_entries()
  p(f"devices ({len(entries)}):")
  for name, entry in entries.items():
    reason = Device.availability(name)
    prio = entry.spec.priority if entry.spec is not None else "-"
    p(f"  {name:<8} priority {prio!s:>4}  {'available' if reason is None else 'unavailable: ' + reason}  [{entry.plugin.label}]")
  for (dev, rname) in plugins.renderer_specs():
    p(f"  {dev + ':' + rname:<8} extra renderer{'' if dev in entries else ' (its device is not installed)'}")
  p()
  try:
    p(f"default device: {Device.DEFAULT}")
  except Exception as e:
    p(f"default device: none ({type(e).__name__}: {str(e).splitlines()[0]})")
    return 1
  return 0


def main(argv: Optional[List[str]] = None) -> int:
  """Entry point of ``python -m tiny``."""
  parser = argparse.ArgumentParser(prog="python -m tiny", description="tiny command line tools")
  sub = parser.add_subparsers(dest="command", required=True)
  d = sub.add_parser("doctor", help="show versions, plugins, devices and the default device")
  d.add_argument("-v", "--verbose", action="store_true", help="print full tracebacks of plugin errors")
  args = parser.parse_args(argv)
  if args.command == "doctor":
    return doctor(verbose=args.verbose)
  return 2


if __name__ == "__main__":
  sys.exit(main())
