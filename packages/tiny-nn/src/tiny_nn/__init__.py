"""tiny_nn: the layers models are built from.

Every layer is a plain class holding `Tensor` attributes; a model is any object tree of them, and
`tiny_nn.state.get_state_dict` names the tensors by attribute path. Constructor arguments and attribute
names follow tinygrad.nn (and so torch.nn), so state dicts line up with checkpoints written by either.
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union, cast

from tiny.dtype import dtypes
from tiny.helpers import make_pair, prod
from tiny.tensor import Tensor, check_index_tensor

__all__ = ["BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
           "Dropout", "Embedding", "GroupNorm", "InstanceNorm", "LayerNorm", "LayerNorm2d", "Linear", "RMSNorm", "Sequential", "dropout"]

IntOrTuple = Union[int, Tuple[int, ...]]


def _numel(shape: Sequence[Any]) -> int:
  # layer shapes are concrete ints; symbolic dims never reach parameter shapes
  return cast(int, prod(shape))


def _affine_shape(ndim: int) -> Tuple[int, ...]:
  # per-channel parameters broadcast over (N, C, *spatial)
  return (1, -1) + (1,) * (ndim - 2)


class BatchNorm:
  """Batch normalization over the channel axis 1 of an (N, C, ...) input (1d, 2d and 3d alike).

  In training mode (`Tensor.training`) it normalizes with the batch statistics and, when `track_running_stats`,
  updates `running_mean`/`running_var` (unbiased variance, like torch); otherwise it uses the running statistics.
  """

  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1):
    self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
    self.weight: Optional[Tensor] = Tensor.ones(sz) if affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(sz) if affine else None
    self.num_batches_tracked = Tensor.zeros(1, dtype=dtypes.int64, requires_grad=False)
    if track_running_stats:
      self.running_mean = Tensor.zeros(sz, requires_grad=False)
      self.running_var = Tensor.ones(sz, requires_grad=False)

  def calc_stats(self, x: Tensor) -> Tuple[Tensor, Tensor]:
    """Mean and (biased) variance used to normalize `x`: the batch's in training, the running ones otherwise."""
    if self.track_running_stats and not Tensor.training:
      return self.running_mean, self.running_var
    axes = tuple(i for i in range(x.ndim) if i != 1)
    mean = x.mean(axis=axes)
    # the derivative of the variance with respect to the mean is zero, so detaching it leaves gradients unchanged
    centered = x - mean.detach().reshape(_affine_shape(x.ndim))
    return mean, (centered * centered).mean(axis=axes)

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2:
      raise ValueError(f"BatchNorm expects an input of shape (N, C, ...), got {x.shape}")
    mean, var = self.calc_stats(x)
    if self.track_running_stats and Tensor.training:
      n = _numel(x.shape) // cast(int, x.shape[1])
      unbiased = var.detach() * (n / max(n - 1, 1))
      self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * mean.detach())
      self.running_var.assign((1 - self.momentum) * self.running_var + self.momentum * unbiased)
      self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    return x.batchnorm(self.weight, self.bias, mean, var.add(self.eps).rsqrt())


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


def _same_padding(kernel_size: Tuple[int, ...], dilation: IntOrTuple) -> List[int]:
  # Tensor.conv2d takes a flat (left, right) list ordered from the last spatial axis to the first; torch puts the odd pixel right
  dil = make_pair(dilation, len(kernel_size))
  pads: List[int] = []
  for k, d in zip(reversed(kernel_size), reversed(dil)):
    total = d * (k - 1)
    pads += [total // 2, total - total // 2]
  return pads


class Conv2d:
  """N-dimensional convolution (2d by default; `kernel_size` with one or three entries gives 1d or 3d).

  weight: (out_channels, in_channels // groups, *kernel_size); `padding` is an int, a tuple, or "same" (stride 1).
  """

  def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1,
               padding: Union[int, Tuple[int, ...], str] = 0, dilation: IntOrTuple = 1, groups: int = 1, bias: bool = True):
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible by groups ({groups})")
    self.kernel_size: Tuple[int, ...] = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
    if isinstance(padding, str):
      if padding.lower() != "same":
        raise ValueError(f"padding must be an int, a tuple or 'same', got {padding!r}")
      if stride not in (1, (1,) * len(self.kernel_size)):
        raise ValueError("padding='same' needs stride 1")
      padding = tuple(_same_padding(self.kernel_size, dilation))
    self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
    self.weight = self.initialize_weight(out_channels, in_channels, groups)
    bound = 1 / math.sqrt(_numel(self.weight.shape[1:]))
    self.bias: Optional[Tensor] = Tensor.uniform(out_channels, low=-bound, high=bound) if bias else None

  def initialize_weight(self, out_channels: int, in_channels: int, groups: int) -> Tensor:
    """The default (torch's) initialization: kaiming uniform with a=sqrt(5)."""
    return Tensor.kaiming_uniform(out_channels, in_channels // groups, *self.kernel_size, a=math.sqrt(5))

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: Union[int, str] = 0, dilation: int = 1,
           groups: int = 1, bias: bool = True) -> Conv2d:
  """A 1d convolution over (N, C, L): a Conv2d with a one-entry kernel; weight (out_channels, in_channels // groups, kernel_size)."""
  return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


class ConvTranspose2d(Conv2d):
  """Transposed convolution; weight: (in_channels, out_channels // groups, *kernel_size), like torch."""

  def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple, stride: IntOrTuple = 1, padding: IntOrTuple = 0,
               output_padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1, bias: bool = True):
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
    self.output_padding = output_padding
    # torch sizes the bias bound from weight.shape[1:] of the transposed weight too
    bound = 1 / math.sqrt(_numel(self.weight.shape[1:]))
    if self.bias is not None:
      self.bias = Tensor.uniform(out_channels, low=-bound, high=bound)

  def initialize_weight(self, out_channels: int, in_channels: int, groups: int) -> Tensor:
    return Tensor.kaiming_uniform(in_channels, out_channels // groups, *self.kernel_size, a=math.sqrt(5))

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation,
                              padding=self.padding, output_padding=self.output_padding)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0, output_padding: int = 0,
                    dilation: int = 1, groups: int = 1, bias: bool = True) -> ConvTranspose2d:
  """A 1d transposed convolution over (N, C, L)."""
  return ConvTranspose2d(in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups, bias)


class Linear:
  """y = x @ weight.T + bias; weight: (out_features, in_features), initialized like torch."""

  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    self.weight = Tensor.kaiming_uniform(out_features, in_features, a=math.sqrt(5))
    bound = 1 / math.sqrt(in_features)
    self.bias: Optional[Tensor] = Tensor.uniform(out_features, low=-bound, high=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    return x.linear(self.weight.transpose(), self.bias)


class GroupNorm:
  """Normalizes each of `num_groups` channel groups of an (N, C, ...) input, then applies a per-channel affine map."""

  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    if num_channels % num_groups:
      raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight: Optional[Tensor] = Tensor.ones(num_channels) if affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(num_channels) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels:
      raise ValueError(f"GroupNorm expects (N, {self.num_channels}, ...), got {x.shape}")
    x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None or self.bias is None:
      return x
    return x * self.weight.reshape(_affine_shape(x.ndim)) + self.bias.reshape(_affine_shape(x.ndim))


class InstanceNorm:
  """Normalizes every channel of every sample on its own; affine by default, like tinygrad (torch's default is False)."""

  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
    self.num_features, self.eps = num_features, eps
    self.weight: Optional[Tensor] = Tensor.ones(num_features) if affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(num_features) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 3 or x.shape[1] != self.num_features:
      raise ValueError(f"InstanceNorm expects (N, {self.num_features}, ...), got {x.shape}")
    x = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None or self.bias is None:
      return x
    return x * self.weight.reshape(_affine_shape(x.ndim)) + self.bias.reshape(_affine_shape(x.ndim))


class LayerNorm:
  """Normalizes over the trailing `normalized_shape` axes, then applies an elementwise affine map."""

  def __init__(self, normalized_shape: Union[int, Tuple[int, ...]], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape: Tuple[int, ...] = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.axis = tuple(-1 - i for i in range(len(self.normalized_shape)))
    self.eps, self.elementwise_affine = eps, elementwise_affine
    self.weight: Optional[Tensor] = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
    self.bias: Optional[Tensor] = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if tuple(x.shape[-n:]) != self.normalized_shape:
      raise ValueError(f"LayerNorm over {self.normalized_shape} got an input of shape {x.shape}")
    x = x.layernorm(eps=self.eps, axis=self.axis)
    if self.weight is None or self.bias is None:
      return x
    return x * self.weight + self.bias


class LayerNorm2d(LayerNorm):
  """LayerNorm over the channel axis of an (N, C, H, W) input."""

  def __call__(self, x: Tensor) -> Tensor:
    return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class RMSNorm:
  """x / sqrt(mean(x^2) + eps) * weight over the last axis, computed in float32 and cast back."""

  def __init__(self, dim: int, eps: float = 1e-6):
    self.eps = eps
    self.weight = Tensor.ones(dim)

  def _norm(self, x: Tensor) -> Tensor:
    return x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()

  def __call__(self, x: Tensor) -> Tensor:
    return self._norm(x.float()).cast(x.dtype) * self.weight


class Embedding:
  """A lookup table: `Embedding(vocab_size, embed_size)(idx)` has shape idx.shape + (embed_size,).

  The lookup is written as a one-hot comparison against an arange, so it fuses into a single reduce kernel and
  is differentiable with respect to `weight` without any gather op.

  Valid indices are 0..vocab_size-1 (torch's rule: no negative indices). They are not checked by default (that would
  need a device sync): an out-of-range index gives a row of zeros. With CHECK_INDEX=1 (or `with Context(CHECK_INDEX=1)`)
  they are read back and an out-of-range one raises IndexError, as in torch; the check is skipped while a TinyJit captures.
  """

  def __init__(self, vocab_size: int, embed_size: int):
    self.vocab_sz, self.embed_sz = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size)

  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype):
      raise TypeError(f"Embedding indices must be integers, got {idx.dtype}")
    if idx.numel() == 0:
      return Tensor.empty(*idx.shape, self.embed_sz, device=self.weight.device)
    check_index_tensor(idx, self.vocab_sz, f"Embedding with vocab_size={self.vocab_sz}", allow_negative=False)
    big = tuple(idx.shape) + (self.vocab_sz, self.embed_sz)
    arange = Tensor.arange(self.vocab_sz, requires_grad=False, device=self.weight.device).reshape(self.vocab_sz, 1)
    hit = idx.reshape(*idx.shape, 1, 1).expand(big) == arange.expand(big)
    return hit.where(self.weight.expand(big), 0).sum(-2)


def dropout(x: Tensor, p: float = 0.5) -> Tensor:
  """Zeroes each element with probability `p` and rescales by 1/(1-p) in training mode; identity otherwise."""
  if not 0 <= p <= 1:
    raise ValueError(f"dropout probability must be in [0, 1], got {p}")
  return x.dropout(p)


class Dropout:
  """`dropout` as a callable, for lists of layers."""

  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1:
      raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    self.p = p

  def __call__(self, x: Tensor) -> Tensor:
    return x.dropout(self.p)


class Sequential:
  """Applies callables in order; `Sequential(a, b)(x) == b(a(x))`. Its state dict names are `layers.0.…`, `layers.1.…`."""

  def __init__(self, *layers: Callable[[Tensor], Tensor]):
    self.layers: List[Callable[[Tensor], Tensor]] = list(layers)

  def __call__(self, x: Tensor) -> Tensor:
    return x.sequential(self.layers)

  def __getitem__(self, i: int) -> Callable[[Tensor], Tensor]:
    return self.layers[i]

  def __len__(self) -> int:
    return len(self.layers)

