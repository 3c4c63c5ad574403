"""Vector exp2 and log2 for the C renderer: GNU-vector C that compilers turn into SIMD code.

libm's exp2f/log2f are scalar calls (clang 14 cannot map them to a vector library), so a vectorized kernel that calls
them per lane runs at libm speed. These helpers compute float32 lanes with vector arithmetic only:

- exp2(x): n = round(x), f = x - n in [-0.5, 0.5]; 2^f by its degree-7 Taylor polynomial (error below 1e-8 relative);
  2^n applied as two exponent-field scalings, so results that overflow become inf and those in the subnormal range
  round like any product. NaN stays NaN, -inf gives 0, inf gives inf.
- log2(x): x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log2(m) = 2/ln2 * atanh(s), s = (m-1)/(m+1), |s| < 0.172, by its
  series to s^11. Subnormal inputs are scaled by 2^23 first. x < 0 or NaN gives NaN, 0 gives -inf, inf gives inf.

Both agree with numpy to a few ulp (tests/test_vmath.py checks them over every exponent and the special values).
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Tuple


# polynomial coefficients, highest power first: 2^f (Taylor, ln2^k/k!) and atanh(s)/s in s^2 (1/(2k+1))
_EXP2_POLY = ("1.5252733804059838e-05", "1.5403530393381606e-04", "1.3333558146428441e-03", "9.6181291076284772e-03",
              "5.5504108664821576e-02", "2.4022650695910071e-01", "6.9314718055994531e-01", "1.0")
_LOG2_POLY = ("0.0909090909090909", "0.1111111111111111", "0.1428571428571428", "0.2", "0.3333333333333333", "1.0")


def _c_horner(vec: str, x: str, coeffs: Tuple[str, ...]) -> str:
  """C lines computing `vec p` = the polynomial in x by Horner's rule (`zero` broadcasts the first coefficient)."""
  return "\n".join([f"  {vec} p = zero + {coeffs[0]}f;"] + [f"  p = p * {x} + {c}f;" for c in coeffs[1:]])


def exp2_source(vec: str, ivec: str) -> str:
  """C for `static inline vec tiny_exp2_<vec>(vec x)`; ivec is the int32 vector type with the same lane count."""
  return f"""static inline {vec} tiny_exp2_{vec}({vec} x) {{
  {vec} zero = ({vec})(({ivec})x & 0);
  {ivec} nan = ({ivec})(x != x);
  {vec} xc = ({vec})(({ivec})x & ~nan);
  {ivec} lo = ({ivec})(xc < -152.0f), hi = ({ivec})(xc > 129.0f);
  xc = ({vec})((({ivec})xc & ~lo & ~hi) | (({ivec})(zero - 152.0f) & lo) | (({ivec})(zero + 129.0f) & hi));
  {vec} n = (xc + 12582912.0f) - 12582912.0f;
  {vec} f = xc - n;
{_c_horner(vec, "f", _EXP2_POLY)}
  {ivec} ni = __builtin_convertvector(n, {ivec});
  {ivec} n1 = ni >> 1, n2 = ni - n1;
  {vec} s1 = ({vec})((n1 + 127) << 23), s2 = ({vec})((n2 + 127) << 23);
  {vec} r = (p * s1) * s2;
  return ({vec})((({ivec})r & ~nan) | (({ivec})x & nan));
}}"""


def log2_source(vec: str, ivec: str) -> str:
  """C for `static inline vec tiny_log2_<vec>(vec x)`; ivec is the int32 vector type with the same lane count."""
  return f"""static inline {vec} tiny_log2_{vec}({vec} x) {{
  {vec} zero = ({vec})(({ivec})x & 0);
  {ivec} sub = ({ivec})((x < 1.17549435e-38f) & (x > 0.0f));
  {vec} xs = ({vec})((({ivec})x & ~sub) | (({ivec})(x * 8388608.0f) & sub));
  {ivec} bits = ({ivec})xs;
  {ivec} e = ((bits >> 23) & 0xff) - 127 - (sub & 23);
  {vec} m = ({vec})((bits & 0x007fffff) | 0x3f800000);
  {ivec} big = ({ivec})(m > 1.41421356f);
  m = ({vec})((({ivec})m & ~big) | (({ivec})(m * 0.5f) & big));
  e = e + (big & 1);
  {vec} s = (m - 1.0f) / (m + 1.0f);
  {vec} s2 = s * s;
{_c_horner(vec, "s2", _LOG2_POLY)}
  {vec} r = __builtin_convertvector(e, {vec}) + s * p * 2.8853900817779268f;
  {ivec} iszero = ({ivec})(x == 0.0f), neg = ({ivec})(x < 0.0f), inf = ({ivec})(x == __builtin_inff()), nan = ({ivec})(x != x);
  {ivec} out = ({ivec})r;
  out = (out & ~iszero) | (({ivec})(zero - __builtin_inff()) & iszero);
  out = (out & ~inf) | (({ivec})x & inf);
  out = (out & ~(neg | nan)) | (({ivec})(zero + __builtin_nanf("")) & (neg | nan));
  return ({vec})out;
}}"""


# *** the same two functions in LLVM IR (for LLVMRenderer; llvm.exp2/llvm.log2 on vectors become scalar libm calls) ***


class _IR:
  """A tiny SSA builder for one helper function over <n x float> / <n x i32>."""

  def __init__(self, n: int):
    from tiny.backend import dtypes
    from tiny_clang.llvmir import lconst
    self.n, self.cnt = n, 0
    self.lines: List[str] = []
    self.f, self.i, self.b = f"<{n} x float>", f"<{n} x i32>", f"<{n} x i1>"
    self.fc: Callable[[Any], str] = lambda x: "<" + ", ".join([f"float {lconst(float(x), dtypes.float32)}"] * n) + ">"
    self.ic: Callable[[Any], str] = lambda x: "<" + ", ".join([f"i32 {int(x)}"] * n) + ">"

  def __call__(self, text: str) -> str:
    self.cnt += 1
    self.lines.append(f"  %v{self.cnt} = {text}")
    return f"%v{self.cnt}"

  def horner(self, x: str, coeffs: Tuple[str, ...]) -> str:
    p = self.fc(coeffs[0])
    for c in coeffs[1:]:
      p = self(f"fadd contract {self.f} {self(f'fmul contract {self.f} {p}, {x}')}, {self.fc(c)}")
    return p

  def function(self, name: str, result: str) -> str:
    return "\n".join([f"define internal {self.f} @{name}_v{self.n}({self.f} %x) alwaysinline {{", *self.lines, f"  ret {self.f} {result}", "}"])


def exp2_llvm(n: int) -> str:
  """LLVM IR for `@tiny_exp2_v<n>(<n x float>) -> <n x float>` (the algorithm of exp2_source)."""
  b = _IR(n)
  f, i, m, fc, ic = b.f, b.i, b.b, b.fc, b.ic
  nan = b(f"fcmp uno {f} %x, %x")
  xc = b(f"select {m} {nan}, {f} zeroinitializer, {f} %x")
  lo = b(f"fcmp olt {f} {xc}, {fc(-152)}")
  xc = b(f"select {m} {lo}, {f} {fc(-152)}, {f} {xc}")
  hi = b(f"fcmp ogt {f} {xc}, {fc(129)}")
  xc = b(f"select {m} {hi}, {f} {fc(129)}, {f} {xc}")
  big = b(f"fadd {f} {xc}, {fc(12582912.0)}")
  nr = b(f"fsub {f} {big}, {fc(12582912.0)}")
  fr = b(f"fsub {f} {xc}, {nr}")
  p = b.horner(fr, _EXP2_POLY)
  ni = b(f"fptosi {f} {nr} to {i}")
  n1 = b(f"ashr {i} {ni}, {ic(1)}")
  n2 = b(f"sub {i} {ni}, {n1}")
  scales = []
  for k in (n1, n2):
    biased = b(f"add {i} {k}, {ic(127)}")
    scales.append(b(f"bitcast {i} {b(f'shl {i} {biased}, {ic(23)}')} to {f}"))
  r = b(f"fmul {f} {b(f'fmul {f} {p}, {scales[0]}')}, {scales[1]}")
  out = b(f"select {m} {nan}, {f} %x, {f} {r}")
  return b.function("tiny_exp2", out)


def log2_llvm(n: int) -> str:
  """LLVM IR for `@tiny_log2_v<n>(<n x float>) -> <n x float>` (the algorithm of log2_source)."""
  b = _IR(n)
  f, i, m, fc, ic = b.f, b.i, b.b, b.fc, b.ic
  tiny_ = b(f"fcmp olt {f} %x, {fc(1.1754943508222875e-38)}")
  pos = b(f"fcmp ogt {f} %x, zeroinitializer")
  sub = b(f"and {m} {tiny_}, {pos}")
  scaled = b(f"fmul {f} %x, {fc(8388608.0)}")
  xs = b(f"select {m} {sub}, {f} {scaled}, {f} %x")
  bits = b(f"bitcast {f} {xs} to {i}")
  ebits = b(f"and {i} {b(f'lshr {i} {bits}, {ic(23)}')}, {ic(255)}")
  e = b(f"sub {i} {ebits}, {ic(127)}")
  e = b(f"sub {i} {e}, {b(f'select {m} {sub}, {i} {ic(23)}, {i} zeroinitializer')}")
  mbits = b(f"or {i} {b(f'and {i} {bits}, {ic(0x7fffff)}')}, {ic(0x3f800000)}")
  m0 = b(f"bitcast {i} {mbits} to {f}")
  big = b(f"fcmp ogt {f} {m0}, {fc(1.41421356)}")
  half = b(f"fmul {f} {m0}, {fc(0.5)}")
  mm = b(f"select {m} {big}, {f} {half}, {f} {m0}")
  e = b(f"add {i} {e}, {b(f'zext {m} {big} to {i}')}")
  num = b(f"fsub {f} {mm}, {fc(1.0)}")
  den = b(f"fadd {f} {mm}, {fc(1.0)}")
  sv = b(f"fdiv {f} {num}, {den}")
  p = b.horner(b(f"fmul {f} {sv}, {sv}"), _LOG2_POLY)
  tail = b(f"fmul contract {f} {b(f'fmul {f} {sv}, {p}')}, {fc(2.8853900817779268)}")
  r = b(f"fadd contract {f} {b(f'sitofp {i} {e} to {f}')}, {tail}")
  pinf, ninf, qnan = fc(math.inf), fc(-math.inf), fc(math.nan)
  r = b(f"select {m} {b(f'fcmp oeq {f} %x, zeroinitializer')}, {f} {ninf}, {f} {r}")
  r = b(f"select {m} {b(f'fcmp oeq {f} %x, {pinf}')}, {f} %x, {f} {r}")
  r = b(f"select {m} {b(f'fcmp ult {f} %x, zeroinitializer')}, {f} {qnan}, {f} {r}")
  return b.function("tiny_log2", r)
