"""tiny_nn.distributed in one process: sharding, sampling, gradient buckets, the 1-rank group and API errors.

The collectives between real processes are tested in test_nn_mpi.py.
"""
import numpy as np
import pytest

from tiny.dtype import dtypes
from tiny.engine.jit import TinyJit
from tiny.tensor import Tensor

from tiny_nn import Linear
from tiny_nn import distributed as dist
from tiny_nn.optim import SGD, Adam
from tiny_nn.state import get_parameters, safe_load

LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "PMIX_RANK",
                 "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE", "OMPI_MCA_mpi_yield_when_idle")


@pytest.fixture(autouse=True)
def fresh_group(monkeypatch):
  """Every test starts without a default group and without MPI launcher variables."""
  for var in LAUNCHER_VARS:
    monkeypatch.delenv(var, raising=False)
  dist._reset_for_tests()
  yield
  dist._reset_for_tests()


# *** sharding ***

@pytest.mark.parametrize("n,world", [(0, 1), (1, 3), (10, 1), (10, 2), (10, 3), (7, 4), (64, 2), (5, 8)])
def test_shard_indices_partition(n, world):
  shards = [dist.shard_indices(n, r, world) for r in range(world)]
  np.testing.assert_array_equal(np.concatenate(shards), np.arange(n))  # disjoint, in order, covering everything
  sizes = [len(s) for s in shards]
  assert max(sizes) - min(sizes) <= 1
  assert sizes == sorted(sizes, reverse=True)  # the remainder goes to the first ranks


@pytest.mark.parametrize("args,err", [((10, 2, 2), ValueError), ((10, -1, 2), ValueError), ((10, 0, 0), ValueError), ((-1, 0, 1), ValueError),
                                      ((10.0, 0, 1), TypeError), ((10, True, 2), TypeError)])
def test_shard_indices_errors(args, err):
  with pytest.raises(err):
    dist.shard_indices(*args)


def test_sampler_ranks_together_see_the_single_process_batches():
  n, batch, world = 50, 12, 3
  alone = list(dist.DistributedSampler(n, batch, rank=0, world_size=1, seed=7))
  per_rank = [list(dist.DistributedSampler(n, batch, rank=r, world_size=world, seed=7)) for r in range(world)]
  assert len(alone) == n // batch and all(len(p) == len(alone) for p in per_rank)
  for step, whole in enumerate(alone):
    assert len(whole) == batch and len(set(whole.tolist())) == batch  # a permutation's slice: no repeats
    np.testing.assert_array_equal(np.concatenate([p[step] for p in per_rank]), whole)
    assert all(len(p[step]) == batch // world for p in per_rank)
  # deterministic from the seed, and a new order per epoch
  again = dist.DistributedSampler(n, batch, rank=1, world_size=world, seed=7)
  np.testing.assert_array_equal(np.concatenate(list(again)), np.concatenate(per_rank[1]))
  again.set_epoch(1)
  assert not np.array_equal(np.concatenate(list(again)), np.concatenate(per_rank[1]))
  ordered = dist.DistributedSampler(n, batch, rank=0, world_size=world, shuffle=False)
  np.testing.assert_array_equal(next(iter(ordered)), np.arange(4))


def test_sampler_errors():
  with pytest.raises(ValueError, match="multiple of world_size"):
    dist.DistributedSampler(100, 10, rank=0, world_size=3)
  with pytest.raises(ValueError, match="fewer than one global batch"):
    dist.DistributedSampler(5, 8, rank=0, world_size=2)


# *** buckets ***

def _tensors(rng):
  return [Tensor(rng.randn(3, 4).astype(np.float32)), Tensor(rng.randn(5).astype(np.float32)),
          Tensor(rng.randint(-9, 9, (2, 2)).astype(np.int32)), Tensor(rng.randn(10, 10).astype(np.float32)),
          Tensor(np.float32(rng.randn())), Tensor(rng.randn(2, 3).astype(np.float32))]


def test_bucket_plan():
  ts = _tensors(np.random.RandomState(0))
  # float32 sizes in bytes: 48, 20, -, 400, 4, 24; int32: 16. With 80 bytes: [0, 1] (68), [3] alone (too big), [4, 5] (28)
  plan = dist.GradBuckets(ts, bucket_bytes=80)
  assert plan.buckets == [[0, 1], [2], [3], [4, 5]]
  assert len(dist.GradBuckets(ts, bucket_bytes=None)) == 2  # one per dtype
  assert dist.GradBuckets(ts, bucket_bytes=4).buckets == [[0], [1], [2], [3], [4], [5]]
  with pytest.raises(ValueError, match="bucket_bytes"):
    dist.GradBuckets(ts, bucket_bytes=0)


@pytest.mark.parametrize("bucket_bytes", [None, 80, 4])
def test_bucket_round_trip(bucket_bytes):
  ts = _tensors(np.random.RandomState(1))
  want = [t.numpy() for t in ts]
  plan = dist.GradBuckets(ts, bucket_bytes=bucket_bytes)
  flats = plan.to_host(ts)
  assert len(flats) == len(plan.buckets)
  for bucket, flat in zip(plan.buckets, flats):
    np.testing.assert_array_equal(flat, np.concatenate([want[i].reshape(-1) for i in bucket]))
    for i, part in zip(bucket, plan.split(flat, bucket)):
      np.testing.assert_array_equal(part, want[i])
  back = plan.unflatten([Tensor(f) for f in flats])
  assert [b.shape for b in back] == [t.shape for t in ts]
  for b, w in zip(back, want):
    np.testing.assert_array_equal(b.numpy(), w)


def test_bucket_errors():
  ts = _tensors(np.random.RandomState(2))
  plan = dist.GradBuckets(ts)
  with pytest.raises(ValueError, match="expected 6 tensors"):
    plan.to_host(ts[:3])
  with pytest.raises(ValueError, match="planned for"):
    plan.to_host(ts[:-1] + [Tensor.ones(3, 2)])
  with pytest.raises(ValueError, match="bucket tensors"):
    plan.unflatten([])
  with pytest.raises(TypeError, match="bool"):
    dist.GradBuckets([Tensor([True, False])])


# *** the 1-rank group ***

def test_init_without_launcher_is_one_rank():
  g = dist.init()
  assert (g.rank, g.world_size, g.is_main, g.distributed, g.comm) == (0, 1, True, False, None)
  assert dist.get_group() is g and dist.is_main()
  assert dist.init(distributed=False) is g  # set up once


def test_one_rank_collectives_are_identities():
  dist.init(distributed=False)
  x = np.random.RandomState(3).randn(2, 3).astype(np.float32)
  for op in dist.REDUCE_OPS:
    np.testing.assert_array_equal(dist.allreduce(Tensor(x), op).numpy(), x)
  np.testing.assert_array_equal(dist.broadcast(Tensor(x)).numpy(), x)
  gathered = dist.allgather(Tensor(x))
  assert gathered.shape == (1, 2, 3)
  np.testing.assert_array_equal(gathered.numpy()[0], x)
  a = x.copy()
  assert dist.get_group().allreduce_numpy(a, "mean") is a
  np.testing.assert_array_equal(a, x)
  t = Tensor(x)
  dist.broadcast_parameters([t])
  dist.average_buffers([t])
  np.testing.assert_array_equal(t.numpy(), x)


def _train(opt_factory, wrap, steps=3):
  Tensor.manual_seed(5)
  model = Linear(4, 3)
  opt = opt_factory(get_parameters(model))
  if wrap:
    opt = dist.DistributedOptimizer(opt, bucket_bytes=16)
  rng = np.random.RandomState(6)
  with Tensor.train():
    for _ in range(steps):
      opt.zero_grad()
      model(Tensor(rng.randn(8, 4).astype(np.float32))).square().mean().backward()
      opt.step()
  return [p.numpy() for p in get_parameters(model)], opt


@pytest.mark.parametrize("factory", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.01)])
def test_one_rank_distributed_optimizer_equals_plain(factory):
  dist.init(distributed=False)
  want, _ = _train(factory, wrap=False)
  got, opt = _train(factory, wrap=True)
  assert len(opt.plan) > 1 and opt.lr is opt.optimizer.lr
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_save_on_main_writes_safetensors(tmp_path):
  dist.init(distributed=False)
  Tensor.manual_seed(0)
  model = Linear(3, 2)
  dist.save_on_main(model, tmp_path / "m.safetensors")
  loaded = safe_load(tmp_path / "m.safetensors")
  np.testing.assert_array_equal(loaded["weight"].numpy(), model.weight.numpy())
  dist.save_on_main({"w": Tensor([1.0, 2.0])}, tmp_path / "d.safetensors")
  np.testing.assert_array_equal(safe_load(tmp_path / "d.safetensors")["w"].numpy(), [1.0, 2.0])


def test_print_main(capsys):
  dist.init(distributed=False)
  dist.print_main("hello", 3)
  assert capsys.readouterr().out == "hello 3\n"


# *** errors ***

def test_missing_mpi4py_is_a_clear_error(monkeypatch):
  monkeypatch.setattr(dist, "_import_mpi", lambda: None)
  with pytest.raises(dist.DistributedError, match=r"distributed mode was requested.*pip install 'tiny-nn\[mpi\]'"):
    dist.init(distributed=True)
  # started by a launcher with several ranks: training alone on each would be wrong, so auto mode refuses too
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
  with pytest.raises(dist.DistributedError, match="MPI launcher with 2 ranks"):
    dist.init()
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
  assert dist.init().world_size == 1


def test_requesting_mpi_after_a_one_rank_group():
  dist.init(distributed=False)
  with pytest.raises(dist.DistributedError, match="already set up"):
    dist.init(distributed=True)


@pytest.mark.parametrize("call,err,match", [
  (lambda: dist.allreduce(Tensor([1.0]), "avg"), ValueError, "unknown reduction 'avg'"),
  (lambda: dist.allreduce(Tensor([1, 2]), "mean"), TypeError, "floating-point"),
  (lambda: dist.allreduce(np.ones(2)), TypeError, "expects a Tensor"),
  (lambda: dist.allreduce(Tensor([True])), TypeError, "bool"),
  (lambda: dist.broadcast(Tensor([1.0]), root=1), ValueError, "root must be a rank"),
  (lambda: dist.broadcast_parameters([Tensor([1.0])], root=-1), ValueError, "root must be a rank"),
  (lambda: dist.get_group().allreduce_numpy(np.ones((3, 2))[:, 0]), ValueError, "C-contiguous"),
  (lambda: dist.DistributedOptimizer("sgd"), TypeError, "wraps a tiny_nn optimizer"),
])
def test_api_errors(call, err, match):
  dist.init(distributed=False)
  with pytest.raises(err, match=match):
    call()


def test_allreduce_grads_refuses_jit_capture():
  dist.init(distributed=False)
  model = Linear(2, 1)
  opt = dist.DistributedOptimizer(SGD(get_parameters(model), lr=0.1))

  @TinyJit
  def step(x: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sum().backward()
    grads = opt.allreduce_grads([p.grad for p in opt.params])
    opt.set_grads(grads)
    return loss.realize(*opt.schedule_step())

  with Tensor.train():
    step(Tensor.ones(3, 2).contiguous())  # the eager first call is fine
    with pytest.raises(dist.DistributedError, match="cannot be captured by TinyJit"):
      step(Tensor.ones(3, 2).contiguous())


def test_allreduce_grads_checks_count():
  dist.init(distributed=False)
  opt = dist.DistributedOptimizer(SGD(get_parameters(Linear(2, 1)), lr=0.1))
  with pytest.raises(ValueError, match="one gradient per parameter"):
    opt.allreduce_grads([])
  grads = [Tensor([[1.5, -2.0]]), Tensor([0.25])]
  flats = opt.allreduce_grads([g * 1 for g in grads])  # lazy gradients are realized first
  assert len(flats) == 1 and flats[0].dtype == dtypes.float32  # one float32 bucket
  opt.set_grads(flats)
  for p, g in zip(opt.params, grads):
    np.testing.assert_array_equal(p.grad.numpy(), g.numpy())


@pytest.mark.parametrize("bucket_bytes", [None, 80, 4])
def test_device_flatten_matches_host_flatten(bucket_bytes):
  ts = _tensors(np.random.RandomState(4))
  plan = dist.GradBuckets(ts, bucket_bytes=bucket_bytes)
  for dev, host in zip(plan.flatten(ts), plan.to_host(ts)):
    np.testing.assert_array_equal(dev.numpy(), host)
  with pytest.raises(ValueError, match="expected 6 tensors"):
    plan.flatten(ts[1:])


def test_bucket_grads_and_allreduce_buckets_one_rank():
  dist.init(distributed=False)
  Tensor.manual_seed(1)
  model = Linear(3, 2)
  opt = dist.DistributedOptimizer(SGD(get_parameters(model), lr=0.1), bucket_bytes=8)
  with Tensor.train():
    opt.zero_grad()
    model(Tensor.ones(4, 3)).square().sum().backward()
    want = [p.grad.numpy() for p in opt.params]
    flats = opt.bucket_grads()
    assert len(flats) == len(opt.plan) == 2  # the 24-byte weight and the 8-byte bias do not share an 8-byte bucket
    opt.set_grads(opt.allreduce_buckets(flats))
    for p, w in zip(opt.params, want):
      np.testing.assert_array_equal(p.grad.numpy(), w)
    with pytest.raises(ValueError, match="expected 2 bucket tensors"):
      opt.allreduce_buckets(flats[:1])


def test_yield_default_only_when_ranks_fill_the_cores(monkeypatch):
  import os
  cores = os.cpu_count() or 1
  monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(cores - 1))
  dist._yield_when_cores_are_shared()
  assert "OMPI_MCA_mpi_yield_when_idle" not in os.environ
  monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", str(cores))
  dist._yield_when_cores_are_shared()
  assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "1"
  monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")  # the user's choice wins
  dist._yield_when_cores_are_shared()
  assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "0"
