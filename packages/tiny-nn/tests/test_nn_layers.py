"""tiny_nn layers against torch.nn: forward outputs, gradients of input and parameters, state dict names, initialization."""
import math

import numpy as np
import pytest

from tiny.tensor import Tensor

import tiny_nn
from tiny_nn.state import get_state_dict

torch = pytest.importorskip("torch", reason="torch is the reference for the layer tests (pip install torch==2.13.0)")


@pytest.fixture(autouse=True)
def _eval_mode():
  prev = Tensor.training
  Tensor.training = False
  yield
  Tensor.training = prev


def _copy_params(layer, ref):
  """Copies the tiny layer's parameters into the torch module (names must match) and returns the torch name->tiny map."""
  tiny_sd = get_state_dict(layer)
  ref_sd = dict(ref.named_parameters())
  for name, p in ref_sd.items():
    with torch.no_grad():
      p.copy_(torch.tensor(tiny_sd[name].numpy()))
  return {name: tiny_sd[name] for name in ref_sd}


def check_layer(layer, ref, x_np, atol=1e-4, rtol=1e-4, grad=True):
  """Forward, then backward of sum(out * g) for a random g, against torch: output, input grad, parameter grads."""
  params = _copy_params(layer, ref)
  x = Tensor(x_np, requires_grad=grad)
  for p in params.values():
    p.requires_grad = True
  out = layer(x)
  xt = torch.tensor(x_np, requires_grad=grad)
  out_ref = ref(xt)
  np.testing.assert_allclose(out.numpy(), out_ref.detach().numpy(), atol=atol, rtol=rtol)
  if not grad:
    return
  g = np.random.RandomState(1).randn(*out_ref.shape).astype(np.float32)
  (out * Tensor(g)).sum().backward()
  (out_ref * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), atol=atol, rtol=rtol)
  for name, p in ref.named_parameters():
    np.testing.assert_allclose(params[name].grad.numpy(), p.grad.numpy(), atol=atol, rtol=rtol, err_msg=name)


def rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def test_linear():
  check_layer(tiny_nn.Linear(5, 3), torch.nn.Linear(5, 3), rand(4, 5))


def test_linear_no_bias_batched():
  lin = tiny_nn.Linear(5, 3, bias=False)
  assert lin.bias is None
  check_layer(lin, torch.nn.Linear(5, 3, bias=False), rand(2, 4, 5))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding=2, dilation=2), dict(groups=2, padding=1)])
def test_conv2d(kw):
  check_layer(tiny_nn.Conv2d(4, 6, 3, **kw), torch.nn.Conv2d(4, 6, 3, **kw), rand(2, 4, 7, 6))


def test_conv2d_rect_kernel_no_bias():
  check_layer(tiny_nn.Conv2d(2, 3, (3, 2), bias=False), torch.nn.Conv2d(2, 3, (3, 2), bias=False), rand(1, 2, 5, 5))


@pytest.mark.parametrize("k,d", [(3, 1), (4, 1), (3, 2)])
def test_conv2d_same_padding(k, d):
  check_layer(tiny_nn.Conv2d(2, 3, k, padding="same", dilation=d), torch.nn.Conv2d(2, 3, k, padding="same", dilation=d), rand(1, 2, 6, 7))


def test_conv2d_rejects_bad_arguments():
  with pytest.raises(ValueError, match="groups"):
    tiny_nn.Conv2d(3, 4, 3, groups=2)
  with pytest.raises(ValueError, match="same"):
    tiny_nn.Conv2d(2, 2, 3, padding="valid")


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1)])
def test_conv1d(kw):
  check_layer(tiny_nn.Conv1d(3, 5, 3, **kw), torch.nn.Conv1d(3, 5, 3, **kw), rand(2, 3, 9))


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1, output_padding=1), dict(groups=2)])
def test_conv_transpose2d(kw):
  check_layer(tiny_nn.ConvTranspose2d(4, 6, 3, **kw), torch.nn.ConvTranspose2d(4, 6, 3, **kw), rand(2, 4, 4, 5))


def test_conv_transpose1d():
  check_layer(tiny_nn.ConvTranspose1d(3, 2, 3, stride=2), torch.nn.ConvTranspose1d(3, 2, 3, stride=2), rand(2, 3, 5))


def test_batchnorm2d_training_updates_running_stats():
  Tensor.training = True
  bn, ref = tiny_nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  bn.weight.assign(Tensor(rand(3, seed=5))).realize()
  ref.train()
  x_np = rand(4, 3, 2, 3) * 2 + 1
  check_layer(bn, ref, x_np)
  np.testing.assert_allclose(bn.running_mean.numpy(), ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bn.running_var.numpy(), ref.running_var.numpy(), rtol=1e-5, atol=1e-6)
  assert bn.num_batches_tracked.numpy().item() == ref.num_batches_tracked.item() == 1


def test_batchnorm_eval_uses_running_stats():
  bn, ref = tiny_nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  mean, var = rand(3, seed=2), np.abs(rand(3, seed=3)) + 0.5
  bn.running_mean.assign(Tensor(mean)).realize()
  bn.running_var.assign(Tensor(var)).realize()
  ref.running_mean.copy_(torch.tensor(mean))
  ref.running_var.copy_(torch.tensor(var))
  ref.eval()
  check_layer(bn, ref, rand(2, 3, 4, 4))


def test_batchnorm1d_no_affine():
  Tensor.training = True
  bn, ref = tiny_nn.BatchNorm1d(4, affine=False, track_running_stats=False), torch.nn.BatchNorm1d(4, affine=False, track_running_stats=False)
  assert bn.weight is None and bn.bias is None
  check_layer(bn, ref, rand(6, 4))


def test_groupnorm():
  check_layer(tiny_nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6), rand(2, 6, 3, 2) * 3)
  with pytest.raises(ValueError, match="divisible"):
    tiny_nn.GroupNorm(4, 6)


def test_instancenorm():
  check_layer(tiny_nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True), rand(2, 3, 4, 5) + 2)


def test_layernorm():
  check_layer(tiny_nn.LayerNorm(5), torch.nn.LayerNorm(5), rand(3, 4, 5))
  check_layer(tiny_nn.LayerNorm((4, 5), eps=1e-3), torch.nn.LayerNorm((4, 5), eps=1e-3), rand(3, 4, 5))
  with pytest.raises(ValueError, match="LayerNorm"):
    tiny_nn.LayerNorm(5)(Tensor(rand(2, 4)))


def test_layernorm2d():
  class Ref(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.ln = torch.nn.LayerNorm(3)
      self.weight, self.bias = self.ln.weight, self.ln.bias

    def forward(self, x):
      return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
  ref = Ref()
  ln = tiny_nn.LayerNorm2d(3)
  ln.weight.assign(Tensor(rand(3, seed=4))).realize()
  with torch.no_grad():
    ref.ln.weight.copy_(torch.tensor(ln.weight.numpy()))
  x = rand(2, 3, 4, 2)
  np.testing.assert_allclose(ln(Tensor(x)).numpy(), ref(torch.tensor(x)).detach().numpy(), atol=1e-5)


def test_rmsnorm():
  layer = tiny_nn.RMSNorm(6, eps=1e-6)
  layer.weight.assign(Tensor(rand(6, seed=9))).realize()
  check_layer(layer, torch.nn.RMSNorm(6, eps=1e-6), rand(2, 3, 6))


def test_embedding():
  emb, ref = tiny_nn.Embedding(10, 4), torch.nn.Embedding(10, 4)
  params = _copy_params(emb, ref)
  params["weight"].requires_grad = True
  idx = np.array([[1, 3, 3], [9, 0, 1]], dtype=np.int32)
  out = emb(Tensor(idx))
  out_ref = ref(torch.tensor(idx, dtype=torch.long))
  np.testing.assert_allclose(out.numpy(), out_ref.detach().numpy())
  g = rand(2, 3, 4, seed=3)
  (out * Tensor(g)).sum().backward()
  (out_ref * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(params["weight"].grad.numpy(), ref.weight.grad.numpy(), atol=1e-6)
  with pytest.raises(TypeError, match="integers"):
    emb(Tensor([0.5]))


def test_embedding_out_of_range():
  from tiny.helpers import Context
  emb, ref = tiny_nn.Embedding(4, 3), torch.nn.Embedding(4, 3)
  _copy_params(emb, ref)
  w = ref.weight.detach().numpy()
  idx = np.array([[0, 4], [-1, 3]], dtype=np.int32)
  for bad in (4, -1):
    with pytest.raises(IndexError):
      ref(torch.tensor([bad]))
  # default: not checked (a device sync), an out-of-range index gives a zero row
  valid = (idx >= 0) & (idx < 4)
  np.testing.assert_array_equal(emb(Tensor(idx)).numpy(), np.where(valid[..., None], w[np.where(valid, idx, 0)], 0))
  with Context(CHECK_INDEX=1):
    with pytest.raises(IndexError, match=r"index 4 at position \(0, 1\) is out of bounds for Embedding with vocab_size=4 \(valid range \[0, 3\]\)"):
      emb(Tensor(idx))
    with pytest.raises(IndexError, match="index -1 at position 0"):
      emb(Tensor([-1, 0]))
    ok = np.array([[3, 0], [1, 3]], dtype=np.int32)
    np.testing.assert_allclose(emb(Tensor(ok)).numpy(), ref(torch.tensor(ok, dtype=torch.long)).detach().numpy())


def test_dropout():
  x = Tensor.ones(1000)
  np.testing.assert_array_equal(tiny_nn.dropout(x, 0.5).numpy(), np.ones(1000))  # identity outside training
  Tensor.training = True
  y = tiny_nn.Dropout(0.25)(x).numpy()
  kept = y != 0
  assert 0.6 < kept.mean() < 0.9
  np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
  with pytest.raises(ValueError):
    tiny_nn.dropout(x, 1.5)


def test_sequential():
  a, b = tiny_nn.Linear(3, 4), tiny_nn.Linear(4, 2)
  seq = tiny_nn.Sequential(a, Tensor.relu, b)
  x = Tensor(rand(5, 3))
  np.testing.assert_allclose(seq(x).numpy(), b(a(x).relu()).numpy(), atol=1e-6)
  assert sorted(get_state_dict(seq)) == ["layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight"]


@pytest.mark.parametrize("make", [
  lambda m: m.Linear(3, 4), lambda m: m.Conv2d(2, 4, 3), lambda m: m.ConvTranspose2d(2, 4, 3), lambda m: m.BatchNorm2d(3),
  lambda m: m.GroupNorm(2, 4), lambda m: m.LayerNorm(3), lambda m: m.Embedding(5, 2)])
def test_state_dict_names_and_shapes_match_torch(make):
  ours = {k: tuple(v.shape) for k, v in get_state_dict(make(tiny_nn)).items()}
  theirs = {k: tuple(v.shape) for k, v in make(torch.nn).state_dict().items()}
  assert ours.keys() == theirs.keys()
  for k in ours:
    # torch keeps num_batches_tracked as a 0-d tensor; load_state_dict accepts it for our (1,)
    assert ours[k] == theirs[k] or (k == "num_batches_tracked" and theirs[k] == ())


def test_default_init_ranges_follow_torch():
  lin = tiny_nn.Linear(50, 40)
  w, b = lin.weight.numpy(), lin.bias.numpy()
  bound = 1 / math.sqrt(50)  # kaiming_uniform(a=sqrt(5)) and the bias both give U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
  assert np.abs(b).max() <= bound and w.std() > bound / 3
  conv = tiny_nn.Conv2d(4, 8, 3)
  cb = 1 / math.sqrt(4 * 9)
  assert np.abs(conv.weight.numpy()).max() <= cb and np.abs(conv.bias.numpy()).max() <= cb
  emb = tiny_nn.Embedding(100, 20).weight.numpy()
  assert np.abs(emb).max() <= math.sqrt(6 / 120) + 1e-6
