"""The main-job demo, `python -m tiny_nn.examples.digits`: model shape always, full training when TINY_NN_DEMO=1."""
import os

import numpy as np
import pytest

from tiny.tensor import Tensor

from tiny_nn.state import get_state_dict


def test_digits_net_shapes():
  from tiny_nn.examples.digits import DigitsNet
  net = DigitsNet()
  out = net(Tensor(np.random.RandomState(0).rand(3, 1, 8, 8).astype(np.float32)))
  assert out.shape == (3, 10) and np.isfinite(out.numpy()).all()
  assert "convs.0.weight" in get_state_dict(net) and "norms.2.running_var" in get_state_dict(net)


@pytest.mark.skipif(not os.environ.get("TINY_NN_DEMO"), reason="full training run (~40-100 s on 2 cores); set TINY_NN_DEMO=1 (`nox -s demo` runs the demo itself)")
def test_digits_demo_reaches_target_accuracy():
  pytest.importorskip("sklearn", reason="the digits set ships with scikit-learn")
  from tiny_nn.examples.digits import train
  assert train(progress=False) >= 0.97
