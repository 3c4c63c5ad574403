"""`python -m tiny doctor` prints the lines a plugin module's optional `doctor_notes()` gives, and survives one that raises."""
from __future__ import annotations

import sys
import types

import pytest

from tiny.__main__ import plugin_notes


def _module(monkeypatch: pytest.MonkeyPatch, name: str, **attrs: object) -> None:
  mod = types.ModuleType(name)
  for k, v in attrs.items():
    setattr(mod, k, v)
  monkeypatch.setitem(sys.modules, name, mod)


def test_notes_of_a_plugin_module(monkeypatch: pytest.MonkeyPatch) -> None:
  _module(monkeypatch, "fake_notes_plugin", doctor_notes=lambda: ["pool: python threads", 3])
  assert plugin_notes("fake_notes_plugin") == ["pool: python threads", "3"]


def test_no_notes_function_or_no_module(monkeypatch: pytest.MonkeyPatch) -> None:
  _module(monkeypatch, "fake_plain_plugin")
  assert plugin_notes("fake_plain_plugin") == []
  assert plugin_notes("not_imported_anywhere") == []


def test_a_raising_notes_function_becomes_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
  def boom() -> list:
    raise OSError("no /proc here")
  _module(monkeypatch, "fake_broken_plugin", doctor_notes=boom)
  assert plugin_notes("fake_broken_plugin") == ["doctor_notes() raised OSError: no /proc here"]
