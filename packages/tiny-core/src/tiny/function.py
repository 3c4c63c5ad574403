"""Autograd Functions: each one computes its forward pass on LazyBuffers and knows its own derivative.

`Tensor` calls `F.Name.apply(*tensors, **kwargs)`. `forward` gets the LazyBuffers of the inputs, `backward` gets the
LazyBuffer of the output gradient and returns one gradient per input (None where no gradient flows).
Everything here is written with the small set of LazyBuffer ops (elementwise, reduce, movement) the scheduler fuses.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union, cast

from tiny.dtype import DType, dtypes, sum_acc_dtype
from tiny.helpers import all_int, argsort, prod
from tiny.lazy import LazyBuffer
from tiny.ops import BinaryOps, ReduceOps, TernaryOps, UnaryOps
from tiny.shape.symbolic import sint
from tiny.tensor import Function, Tensor

_LOG2_E = 1 / math.log(2)
_LN_2 = math.log(2)


def _div(x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
  """x / y elementwise: a multiply by the reciprocal for floats, C-style truncating division for ints."""
  return x.e(BinaryOps.MUL, y.e(UnaryOps.RECIP)) if dtypes.is_float(x.dtype) else x.e(BinaryOps.IDIV, y)


def _sub(x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
  return x.e(BinaryOps.ADD, y.e(UnaryOps.NEG))


# exp(x) as EXP2(x*log2(e)) loses |x*log2(e)| * 2^-24 of relative accuracy to the rounding of the product (60+ ulp near
# the ends of the float32 range), so _exp reduces the argument itself. Per dtype: the int of the same size, mantissa bits,
# exponent bias, the clamp range (past it the result is 0 or inf anyway), ln2 = LN2_HI + LN2_LO with LN2_HI short enough
# that n*LN2_HI is exact for every n the clamp allows, and the coefficients of e^r on |r| <= ln2/2, highest power first.
# float64: Taylor to degree 13 (~0.1 ulp). float32: degree 6, 1 + r + r^2*q(r) with q fitted to (e^r-1-r)/r^2 by
# reweighted least squares for the smallest relative error (~3.6e-9 = 0.06 ulp, against 0.085 ulp for Taylor's degree 7:
# one FMA less per value, and e^0 is still exactly 1)
_EXP_POLY32 = (0.001381453825160861, 0.00836874544620514, 0.04166838899254799, 0.1666652113199234, 0.4999999403953552, 1.0, 1.0)
_EXP_PARAMS = {
  dtypes.float32: (dtypes.int32, 23, 127, -104.0, 89.0, 0.693145751953125, 1.428606765330187e-06, _EXP_POLY32),
  dtypes.float64: (dtypes.int64, 52, 1023, -746.0, 710.0, 0.6931471805598903, 5.497923018708371e-14,
                   tuple(1 / math.factorial(i) for i in range(13, -1, -1))),
}


def _exp(x: LazyBuffer, nonpositive: bool = False) -> LazyBuffer:
  """e**x to ~1 ulp over the whole range, from + * and bit ops only (no EXP2, so every device gives the same result).

  x = n*ln2 + r with n = round(x*log2(e)) and |r| <= ln2/2 computed exactly enough with the two-part ln2 (Cody-Waite);
  e**r by a polynomial (_EXP_PARAMS); 2**n applied as two exponent-field scalings 2**floor(n/2) * 2**ceil(n/2), both normal,
  so that subnormal results round once and overflow gives inf. NaN propagates through the arithmetic; -inf and inf are
  clamped to values that give 0 and inf. float16/bfloat16 are computed in float32. Kept to few ops (MULACC): every op
  here is repeated per upcast lane, and codegen time grows with the op count.

  nonpositive: the caller guarantees x <= 0 or NaN (softmax's x - max(x)). Then n <= 0, so one scaling by 2**(n+K) is
  normal for every n the clamp allows, and the polynomial's coefficients carry the 2**-K (exact: a power of two): the
  product p*2**(n+K) rounds once into the subnormal range as before. That drops the upper clamp and the second scaling."""
  if x.dtype not in _EXP_PARAMS:
    return _exp(x.cast(dtypes.float32), nonpositive).cast(x.dtype)
  it, mant, bias, lo, hi, ln2_hi, ln2_lo, poly = _EXP_PARAMS[x.dtype]

  def fma(a: LazyBuffer, b: float, c: Union[float, LazyBuffer]) -> LazyBuffer:
    return a.e(TernaryOps.MULACC, a.const(b), c if isinstance(c, LazyBuffer) else a.const(c))

  # clamps as MAX (tiny's MAX keeps a NaN from either side, so NaN passes through), min(x, hi) as -max(-x, -hi): unlike
  # compare+where, these pack into vector ops on SIMD CPUs, which keeps the whole polynomial vectorized
  xc = x.e(BinaryOps.MAX, x.const(lo))
  if not nonpositive:
    xc = xc.e(UnaryOps.NEG).e(BinaryOps.MAX, xc.const(-hi)).e(UnaryOps.NEG)
  # adding 1.5*2^mant rounds to an integer n, which then sits in the low mantissa bits of the sum
  magic = 1.5 * 2.0 ** mant
  k = fma(xc, _LOG2_E, magic)
  nf = k.e(BinaryOps.ADD, k.const(-magic))
  r = fma(nf, -ln2_lo, fma(nf, -ln2_hi, xc))
  # nonpositive: K lifts the smallest n (lo*log2(e), rounded) to the smallest normal exponent, 1 - bias
  lift = -round(lo * _LOG2_E) - (bias - 1) if nonpositive else 0
  scale = 2.0 ** -lift
  p = fma(r, poly[0] * scale, poly[1] * scale)
  for c in poly[2:]:
    p = p.e(TernaryOps.MULACC, r, r.const(c * scale))
  # bits(k) = bits(magic) + n
  kb = k.cast(it, bitcast=True, allow_buffer_view=False)
  magic_bits = ((bias + mant) << mant) + (1 << (mant - 1))
  if nonpositive:
    e = kb.e(BinaryOps.ADD, kb.const(bias + lift - magic_bits))
    return p.e(BinaryOps.MUL, e.e(BinaryOps.SHL, e.const(mant)).cast(x.dtype, bitcast=True, allow_buffer_view=False))
  # the biased exponents of the two scalings are floor((n + 2*bias)/2) and ceil((n + 2*bias)/2)
  for rnd in (0, 1):
    e = kb.e(BinaryOps.ADD, kb.const(2 * bias + rnd - magic_bits)).e(BinaryOps.SHR, kb.const(1))
    p = p.e(BinaryOps.MUL, e.e(BinaryOps.SHL, e.const(mant)).cast(x.dtype, bitcast=True, allow_buffer_view=False))
  return p


class Contiguous(Function):
  """Force the data into a buffer of its own (a kernel boundary); the gradient passes through."""

  def forward(self, x: LazyBuffer) -> LazyBuffer:
    return x.contiguous()

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output


class ContiguousBackward(Function):
  """Identity forward; makes the gradient contiguous on the way back."""

  def forward(self, x: LazyBuffer) -> LazyBuffer:
    return x

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.contiguous()


class Cast(Function):
  """Convert to another dtype (or reinterpret the bits, which has no gradient)."""

  def forward(self, x: LazyBuffer, dtype: DType, bitcast: bool = False, in_kernel: bool = False) -> LazyBuffer:
    # in_kernel: a bitcast computed in the kernel that uses it, instead of a view of x's realized buffer
    self.input_dtype, self.bitcast = x.dtype, bitcast
    return x.cast(dtype, bitcast, allow_buffer_view=not in_kernel)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    if self.bitcast:
      raise RuntimeError("bitcast has no gradient")
    return grad_output.cast(self.input_dtype)


# ************* unary ops *************

class Neg(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    return x.e(UnaryOps.NEG)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.e(UnaryOps.NEG)


class Reciprocal(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(UnaryOps.RECIP)
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    # d(1/x) = -1/x^2
    return grad_output.e(UnaryOps.NEG).e(BinaryOps.MUL, self.ret).e(BinaryOps.MUL, self.ret)


class Sin(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.SIN)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    # cos(x) = sin(pi/2 - x)
    return _sub(self.x.const(math.pi / 2), self.x).e(UnaryOps.SIN).e(BinaryOps.MUL, grad_output)


class Relu(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(BinaryOps.MAX, x.const(0))
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    # ret != 0 rather than ret > 0: a NaN input passes its gradient on, as torch's relu does
    return self.ret.e(BinaryOps.CMPNE, self.ret.const(0)).cast(grad_output.dtype).e(BinaryOps.MUL, grad_output)


class Log(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(UnaryOps.LOG2).e(BinaryOps.MUL, x.const(_LN_2))

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.e(BinaryOps.MUL, self.x.e(UnaryOps.RECIP))


class Exp(Function):
  def forward(self, x: LazyBuffer, nonpositive: bool = False) -> LazyBuffer:
    # nonpositive: x <= 0 (or NaN) is known, as for softmax's x - max(x); see _exp
    self.ret = _exp(x, nonpositive)
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.e(BinaryOps.MUL, grad_output)


class Exp2(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(UnaryOps.EXP2)
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.e(BinaryOps.MUL, self.ret.const(_LN_2)).e(BinaryOps.MUL, grad_output)


class Sqrt(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.e(UnaryOps.SQRT)
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.e(BinaryOps.MUL, self.ret.e(BinaryOps.MUL, self.ret.const(2)).e(UnaryOps.RECIP))


class Sigmoid(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.const(1).e(BinaryOps.ADD, _exp(x.e(UnaryOps.NEG))).e(UnaryOps.RECIP)
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.e(BinaryOps.MUL, _sub(self.ret.const(1), self.ret)).e(BinaryOps.MUL, grad_output)


class Sign(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    # NaN is neither below nor above 0 and gets 0, as in torch; so does -0.0 (the constant is +0)
    zero = x.const(0)
    is_pos = zero.e(BinaryOps.CMPLT, x).e(TernaryOps.WHERE, x.const(1), zero)
    return x.e(BinaryOps.CMPLT, zero).e(TernaryOps.WHERE, x.const(-1), is_pos)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    # sign is flat almost everywhere (and we define the derivative at 0 as 0 too)
    return grad_output.const(0)


# ************* binary ops *************

class Less(Function):
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.CMPLT, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    return None, None


class Neq(Function):
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.CMPNE, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    return None, None


class Xor(Function):
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.XOR, y)


class Mod(Function):
  """C remainder of integers (sign of the dividend), total: x % 0 == 0 and MIN % -1 == 0."""
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.MOD, y)


class BitwiseAnd(Function):
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.AND, y)


class BitwiseOr(Function):
  differentiable = False

  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.OR, y)


class Threefry(Function):
  """The Threefry-2x32 block cipher on uint64 counters with a uint64 key (the random number generator's core)."""

  differentiable = False

  def forward(self, x: LazyBuffer, seed: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.THREEFRY, seed)


class Add(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return x.e(BinaryOps.ADD, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    return (grad_output if self.needs_input_grad[0] else None), (grad_output if self.needs_input_grad[1] else None)


class Sub(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    return _sub(x, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    return (grad_output if self.needs_input_grad[0] else None), (grad_output.e(UnaryOps.NEG) if self.needs_input_grad[1] else None)


class Mul(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.e(BinaryOps.MUL, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    return (self.y.e(BinaryOps.MUL, grad_output) if self.needs_input_grad[0] else None), \
           (self.x.e(BinaryOps.MUL, grad_output) if self.needs_input_grad[1] else None)


class Div(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return _div(x, y)

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    # d(x/y)/dy = -x/y^2
    return (_div(grad_output, self.y) if self.needs_input_grad[0] else None), \
           (_div(grad_output.e(UnaryOps.NEG).e(BinaryOps.MUL, self.x), self.y.e(BinaryOps.MUL, self.y)) if self.needs_input_grad[1] else None)


class WithGrad(Function):
  """apply(*inputs, value, *derivatives, n=len(inputs)): forward gives value; backward gives grad_output * derivative[i] to inputs[i].

  value and the derivatives are detached tensors of the output's shape, built by the caller. This lets Tensor code state
  the derivative torch uses where autograd of its forward composition would differ (pow at 0, std where it is 0)."""

  def forward(self, *bufs: LazyBuffer, n: int) -> LazyBuffer:
    self.n, self.derivs = n, bufs[n + 1:]
    return bufs[n]

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], ...]:
    grads = [d.e(BinaryOps.MUL, grad_output) if need else None for d, need in zip(self.derivs, self.needs_input_grad)]
    return (*grads, *([None] * (self.n + 1)))


# ************* ternary ops *************

class Where(Function):
  def forward(self, x: LazyBuffer, y: LazyBuffer, z: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.e(TernaryOps.WHERE, y, z)

  def backward(self, grad_output: LazyBuffer) -> Tuple[None, Optional[LazyBuffer], Optional[LazyBuffer]]:
    zero = grad_output.const(0)
    return None, (self.x.e(TernaryOps.WHERE, grad_output, zero) if self.needs_input_grad[1] else None), \
                 (self.x.e(TernaryOps.WHERE, zero, grad_output) if self.needs_input_grad[2] else None)


# ************* reduce ops *************

class Sum(Function):
  def forward(self, x: LazyBuffer, axis: Tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.r(ReduceOps.SUM, axis)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.expand(self.input_shape)


class Max(Function):
  def forward(self, x: LazyBuffer, axis: Tuple[int, ...]) -> LazyBuffer:
    self.x, self.ret, self.axis = x, x.r(ReduceOps.MAX, axis), axis
    return self.ret

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    # the gradient is shared equally between every element that reached the max
    ne = self.x.e(BinaryOps.CMPNE, self.ret.expand(self.x.shape))
    if dtypes.is_float(self.x.dtype):
      # a NaN max equals nothing: the NaNs share the gradient then (as in torch), not 0/0 everywhere
      is_max = ne.e(BinaryOps.CMPNE, self.x.e(BinaryOps.CMPNE, self.x).e(BinaryOps.CMPNE, self.x.const(True).cast(dtypes.bool)))
    else:
      is_max = ne.e(BinaryOps.CMPNE, self.x.const(True).cast(dtypes.bool))
    is_max = is_max.cast(grad_output.dtype)
    count = is_max.r(ReduceOps.SUM, self.axis).expand(self.x.shape)
    return _div(is_max, count).e(BinaryOps.MUL, grad_output.expand(self.x.shape))


# ************* movement ops *************

class Expand(Function):
  def forward(self, x: LazyBuffer, shape: Tuple[sint, ...]) -> LazyBuffer:
    self.expanded_axis = tuple(i for i, (si, so) in enumerate(zip(x.shape, shape)) if si != so)
    return x.expand(shape)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.cast(sum_acc_dtype(grad_output.dtype)).r(ReduceOps.SUM, self.expanded_axis).cast(grad_output.dtype)


class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: Tuple[sint, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.reshape(self.input_shape)


class Permute(Function):
  def forward(self, x: LazyBuffer, order: Tuple[int, ...]) -> LazyBuffer:
    self.input_order = order
    return x.permute(order)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.permute(tuple(argsort(self.input_order)))


class Pad(Function):
  def forward(self, x: LazyBuffer, arg: Tuple[Tuple[int, int], ...]) -> LazyBuffer:
    self.narg = tuple((p[0], s + p[0]) for s, p in zip(x.shape, arg))
    return x.pad(arg)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.shrink(self.narg)


class Shrink(Function):
  def forward(self, x: LazyBuffer, arg: Tuple[Tuple[sint, sint], ...]) -> LazyBuffer:
    self.narg = tuple((p[0], s - p[1]) for s, p in zip(x.shape, arg))
    return x.shrink(arg)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.pad(self.narg)


class Flip(Function):
  def forward(self, x: LazyBuffer, axis: Tuple[int, ...]) -> LazyBuffer:
    self.arg = tuple(-1 if i in axis else 1 for i in range(len(x.shape)))
    return x.stride(self.arg)

  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.stride(self.arg)


def _padded(g: Tensor, pads: Sequence[int]) -> Tensor:
  """g padded (pad2d order; negative amounts crop) into a buffer of its own.

  The transposed convolution reads g through a pad of k-1 on every side. Read through a padded view, every load in the
  conv's inner loop carries a bounds check, and on a small image (a 20x20 gradient padded by 4) most of the vector
  loads straddle a border and fall back to one gated load per lane. One copy into a zero-bordered buffer costs a
  single pass over g (the conv reads each element k*k*cout times) and leaves the conv unmasked, dense loads."""
  return g.pad2d(list(pads)).contiguous()


def _batch_groups(bs: int, pixels: int) -> int:
  """Into how many groups of images the weight gradient splits its reduce over the batch (partial sums added by a
  second, small kernel). Each weight's sum walks the images of its input and output channels; over the whole batch
  of a 20x20 output that is more than the L2 cache holds, so every tile of weights streams it again from memory. A
  group of about 8K output pixels (16 images of 20x20) stays in cache across the tiles (5x5 conv 32->32, batch 64, on
  CLANG: ~1.3x). Small outputs (8x8, 6x6) keep one reduce."""
  per_group = max(1, 8192 // max(1, pixels))
  if per_group >= bs:
    return 1
  return bs // next(d for d in range(per_group, 0, -1) if bs % d == 0)


def _channels_last(x: Tensor, channels: sint, spatial: Tuple[sint, ...]) -> bool:
  """Whether x's device asks for a channels-last conv reduce (`Renderer.conv_channels_last`)."""
  if not all_int((channels, *spatial)) or (renderer := x._renderer()) is None:
    return False
  return renderer.conv_channels_last(cast(int, channels), cast(Tuple[int, ...], spatial), x.dtype)


def _conv_channels_last(x: Tensor, w: Tensor, acc_dtype: Optional[DType]) -> Tensor:
  """`Tensor._conv_composed(w)` (stride 1, no padding) with the output channels innermost: the reduce's output is laid
  out (bs, *out, cout) and w is copied once into (cin, *k, cout), so the kernel's vectors run along the output channels
  (a full vector of weights times one broadcast input element) instead of along a short output row. Returned as a
  (bs, cout, *out) view of that layout."""
  ks = w.shape[2:]
  nd, bs, cout, cin = len(ks), x.shape[0], w.shape[0], w.shape[1]
  sp = list(range(2, 2 + nd))
  wt = w.permute(1, *sp, 0).contiguous()                                    # (cin, *k, cout)
  win = x._pool(ks)                                                         # (bs, cin, *out, *k)
  out_sp = win.shape[2:2 + nd]
  win = win.permute(0, *sp, 1, *range(2 + nd, 2 + 2 * nd)).reshape(bs, *out_sp, 1, cin, *ks)
  prod_ = win * wt.permute(nd + 1, 0, *range(1, nd + 1)).reshape(1, *[1] * nd, cout, cin, *ks)  # (bs, *out, cout, cin, *k)
  out = prod_.sum(tuple(range(2 + nd, 3 + 2 * nd)), acc_dtype=acc_dtype)   # (bs, *out, cout)
  return out.permute(0, nd + 1, *range(1, nd + 1))


def _weight_grad_channels_first(xp: Tensor, g: Tensor, ks: Tuple[sint, ...], grp: int, acc_dtype: Optional[DType]) -> Tensor:
  """The conv weight gradient (cout, cin, *k) from the padded input xp (bs, cin, *in) and the output gradient g
  (bs, cout, *out), as the windowed input times g summed over `grp` groups of images, then over the groups."""
  nd, bs, cout, out_sp = len(ks), g.shape[0], g.shape[1], g.shape[2:]
  win = xp._pool(ks).reshape(grp, bs // grp, *xp.shape[1:2], *out_sp, *ks)                 # (grp, bs/grp, cin, *out, *k)
  prod_ = win.unsqueeze(2) * g.reshape(grp, bs // grp, cout, 1, *out_sp, *[1] * nd)  # (grp, bs/grp, cout, cin, *out, *k)
  # (grp, cout, cin, *k): one partial sum per group, kept in the accumulator dtype until the groups are added
  acc = acc_dtype or sum_acc_dtype(prod_.dtype)
  part = prod_.sum((1, *range(4, 4 + nd)), acc_dtype=acc)
  return part.sum(0, acc_dtype=acc) if grp > 1 else part.reshape(part.shape[1:])


def _weight_grad_channels_last(xp: Tensor, g: Tensor, ks: Tuple[sint, ...], grp: int, acc_dtype: Optional[DType]) -> Tensor:
  """`_weight_grad_channels_first`'s sum with the input channels innermost: xp is copied once into (bs, *in, cin), and
  the reduce's output is laid out (cout, *k, cin), so the kernel's vectors run along the input channels (each a full
  vector times one broadcast element of g) instead of along a short output row. Returned as a (cout, cin, *k) view."""
  nd, bs, cin, cout, out_sp = len(ks), g.shape[0], xp.shape[1], g.shape[1], g.shape[2:]
  sp = list(range(2, 2 + nd))
  xt = xp.permute(0, *sp, 1).contiguous()                                   # (bs, *in, cin)
  win = xt.permute(0, nd + 1, *range(1, nd + 1))._pool(ks)                  # (bs, cin, *out, *k), cin of stride 1
  win = win.permute(0, *sp, *range(2 + nd, 2 + 2 * nd), 1).reshape(grp, bs // grp, *out_sp, 1, *ks, cin)
  gt = g.permute(0, *sp, 1).reshape(grp, bs // grp, *out_sp, cout, *[1] * nd, 1)
  prod_ = win * gt                                                          # (grp, bs/grp, *out, cout, *k, cin)
  acc = acc_dtype or sum_acc_dtype(prod_.dtype)
  part = prod_.sum((1, *range(2, 2 + nd)), acc_dtype=acc)                  # (grp, cout, *k, cin)
  total = part.sum(0, acc_dtype=acc) if grp > 1 else part.reshape(part.shape[1:])
  return total.permute(0, nd + 1, *range(1, nd + 1))


class Conv(Function):
  """N-d convolution (stride 1, no dilation, one group) with a direct backward.

  The forward is the composed pool-and-reduce of `Tensor._conv_composed`. Differentiating that chain would send the
  input gradient back through `_pool`'s repeat/shrink views (a reduce over a view full of div/mod index math, plus a
  window-sized intermediate); instead the input gradient is the transposed convolution, itself a padded convolution
  of the output gradient with the flipped weight, and the weight gradient is the windowed input times the output
  gradient, summed over batch and positions. Where the device asks (`Renderer.conv_channels_last`), both gradients
  are reduced with the input channels innermost; the input gradient is then returned as a permuted view of that
  layout, which the kernels reading it take in as their load indexing."""

  def forward(self, x: LazyBuffer, w: LazyBuffer, padding: Tuple[int, ...] = (), acc_dtype: Optional[DType] = None) -> LazyBuffer:
    self.x, self.w, self.padding, self.acc_dtype = x, w, padding, acc_dtype
    with Tensor.inference_mode():
      return Tensor(x, device=x.device)._conv_composed(Tensor(w, device=w.device), padding=list(padding), acc_dtype=acc_dtype).lazydata

  def backward(self, grad_output: LazyBuffer) -> Tuple[Optional[LazyBuffer], Optional[LazyBuffer]]:
    with Tensor.inference_mode():
      g = Tensor(grad_output, device=grad_output.device)
      x, w = Tensor(self.x, device=self.x.device), Tensor(self.w, device=self.w.device)
      ks = w.shape[2:]
      nd = len(ks)
      spatial = tuple(range(2, 2 + nd))
      gx = gw = None
      if self.needs_input_grad[0]:
        # padding in pad2d order (last dim first, before/after); the transposed conv pads by k-1-p on each side
        pads = [cast(int, ks[nd - 1 - i // 2]) - 1 - p for i, p in enumerate(self.padding)]
        gp = _padded(g, pads) if any(pads) else g
        wf = w.transpose(0, 1).flip(spatial)                              # (cin, cout, *k)
        if _channels_last(x, x.shape[1], x.shape[2:]):
          gx = _conv_channels_last(gp, wf, self.acc_dtype).cast(x.dtype).lazydata
        else:
          gx = gp._conv_composed(wf, acc_dtype=self.acc_dtype).cast(x.dtype).lazydata
      if self.needs_input_grad[1]:
        out_sp = g.shape[2:]
        grp = _batch_groups(cast(int, g.shape[0]), prod(cast(Tuple[int, ...], out_sp))) if all_int((g.shape[0], *out_sp)) else 1
        if _channels_last(x, x.shape[1], out_sp):
          gw = _weight_grad_channels_last(x.pad2d(list(self.padding)), g, ks, grp, self.acc_dtype).cast(w.dtype).lazydata
        else:
          gw = _weight_grad_channels_first(x.pad2d(list(self.padding)), g, ks, grp, self.acc_dtype).cast(w.dtype).lazydata
    return gx, gw

