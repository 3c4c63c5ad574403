"""UPat patterns turned into plain Python functions, for the pattern matcher's hot loop.

`uops._match` interprets a pattern afresh for every uop it tries: it reads each pattern node's fields, copies the dict of
bound names at every named node and builds a list per level. A compiled pattern is one function of nested `if`s made
for that pattern alone: the checks a node does not need are left out, bound names live in local variables, and a dict
is only built for a complete match. It returns exactly what `_match(u, pat, {})` returns, in the same order (the first
store whose rule function gives a uop wins, so the order matters). A pattern shape this module does not handle keeps
the generic matcher (see `compile_upat`)."""
from __future__ import annotations

import itertools
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence

if TYPE_CHECKING:
  from tiny.codegen.uops import UOp, UPat

Matcher = Callable[["UOp"], List[Dict[str, "UOp"]]]

# a list source tries every permutation: each is generated as its own code, so long lists stay generic
_MAX_PERMUTED = 4
# a commutative node repeats the code of what follows it once per operand order: a bound on the size of the function
_MAX_LINES = 4000
# Python's tokenizer refuses more than 100 indentation levels
_MAX_INDENT = 90


class _Unsupported(Exception):
  """The pattern has a shape the generator does not handle: it keeps the generic matcher."""


def compile_upat(pat: UPat) -> Matcher:
  """A function u -> the list of stores (name -> bound uop) that `_match(u, pat, {})` gives, computed by straight-line
  code generated for `pat`; the generic matcher wrapped in such a function where the pattern's shape is not supported."""
  from tiny.codegen.uops import _match
  try:
    return _Generator().function(pat)
  except _Unsupported:
    return lambda u: _match(u, pat, {})


def _has_names(pat: UPat) -> bool:
  if pat.name is not None:
    return True
  src = pat.src
  if src is None:
    return False
  return _has_names(src) if not isinstance(src, (tuple, list)) else any(_has_names(p) for p in src)


def _at_most_one_match(pat: UPat) -> bool:
  """True when `_match` can give this pattern at most one store: no operand orders or permutations to try anywhere."""
  src = pat.src
  if src is None:
    return True
  if isinstance(src, list):
    return len(src) <= 1 and all(_at_most_one_match(p) for p in src)
  if isinstance(src, tuple):
    # any uop with two sources may be commutative
    return len(src) != 2 and all(_at_most_one_match(p) for p in src)
  return _at_most_one_match(src)


class _Generator:
  """Writes the source of one pattern's function. Each pattern node gets the code of its checks, and inside them the code
  of everything matched after it (continuation passing): with no loops, every variable is assigned before it is read on
  each path, and a name bound earlier on the path is checked by identity, as `_match` does."""

  def __init__(self) -> None:
    from tiny.codegen.uops import _arg_eq
    self.env: Dict[str, Any] = {"_arg_eq": _arg_eq}
    self.lines: List[str] = []
    self.nvars = 0

  def function(self, pat: UPat) -> Matcher:
    self.node(pat, "u", {}, 1, self._store)
    src = "\n".join(["def match(u):", "  res = []", *self.lines, "  return res"])
    ns: Dict[str, Any] = dict(self.env)
    exec(compile(src, f"<upat {pat!r:.200}>", "exec"), ns)   # noqa: S102 - the code is generated from the pattern above
    fn = ns["match"]
    fn.source = src
    return fn

  def _const(self, v: Any) -> str:
    name = f"k{len(self.env)}"
    self.env[name] = v
    return name

  def _var(self) -> str:
    self.nvars += 1
    return f"u{self.nvars}"

  def emit(self, ind: int, line: str) -> None:
    if ind > _MAX_INDENT or len(self.lines) > _MAX_LINES:
      raise _Unsupported
    self.lines.append("  " * ind + line)

  def _store(self, bound: Dict[str, str], ind: int) -> None:
    self.emit(ind, "res.append({" + ", ".join(f"{n!r}: {v}" for n, v in bound.items()) + "})")

  def _arg_check(self, u: str, arg: Any) -> str:
    k = self._const(arg)
    if isinstance(arg, Enum) and type(arg).__eq__ is object.__eq__:
      # members of one plain Enum class are equal only to themselves: `is` decides, unless the arg is another type
      return f"({u}.arg is {k} or ({u}.arg.__class__ is not {k}.__class__ and _arg_eq({u}.arg, {k})))"
    return f"_arg_eq({u}.arg, {k})"

  def node(self, pat: UPat, u: str, bound: Dict[str, str], ind: int, cont: Callable[[Dict[str, str], int], None]) -> None:
    """Code matching pattern node `pat` against the uop in variable `u`, with `cont` emitting what comes after it."""
    if pat.name is not None and pat.name in bound:
      # _match checks nothing else of a node whose name is already bound
      self.emit(ind, f"if {u} is {bound[pat.name]}:")
      cont(bound, ind + 1)
      return
    conds: List[str] = []
    if pat.op is not None:
      conds.append(f"{u}.op is {self._const(pat.op[0])}" if len(pat.op) == 1 else f"{u}.op in {self._const(pat.op)}")
    if pat.dtype is not None:
      conds.append(f"{u}.dtype in {self._const(pat.dtype)}")
    if pat.arg is not None:
      conds.append(self._arg_check(u, pat.arg))
    if pat.any_src_op is not None:
      conds.append(f"any([s.op in {self._const(pat.any_src_op)} for s in {u}.src])")
    if conds:
      self.emit(ind, "if " + " and ".join(conds) + ":")
      ind += 1
    if pat.name is not None:
      bound = {**bound, pat.name: u}
    src = pat.src
    if src is None:
      cont(bound, ind)
      return
    if not isinstance(src, (tuple, list)):
      # one pattern every source must match: a plain test when it binds nothing and gives at most one store per source
      if _has_names(src) or not _at_most_one_match(src):
        raise _Unsupported
      each = self._const(_Generator().function(src))
      self.emit(ind, f"if all(map({each}, {u}.src)):")
      cont(bound, ind + 1)
      return
    n = len(src)
    self.emit(ind, f"if len({u}.src) {'>=' if pat.allow_any_len else '=='} {n}:")
    ind += 1
    if isinstance(src, list):
      if n > _MAX_PERMUTED:
        raise _Unsupported
      for order in itertools.permutations(src):
        self._sources(order, u, bound, ind, cont)
    elif n == 2:
      self._sources(src, u, bound, ind, cont)
      self.emit(ind, f"if {u}.commutative():")
      self._sources((src[1], src[0]), u, bound, ind + 1, cont)
    else:
      self._sources(src, u, bound, ind, cont)

  def _sources(self, order: Sequence[UPat], u: str, bound: Dict[str, str], ind: int,
               cont: Callable[[Dict[str, str], int], None]) -> None:
    """Sources 0..len(order)-1 of `u` matched against `order`, one after another, then `cont`."""
    if not order:
      cont(bound, ind)
      return
    names = [self._var() for _ in order]
    self.emit(ind, ", ".join(names) + (" = " if len(names) > 1 else ", = ") + f"{u}.src[:{len(names)}]")

    def chain(i: int) -> Callable[[Dict[str, str], int], None]:
      if i == len(order):
        return cont
      return lambda b, j: self.node(order[i], names[i], b, j, chain(i + 1))
    chain(0)(bound, ind)
