"""Random whole Tensor programs (tiny.testing.program_fuzz) on the device under test: elementwise math, casts,
movement, reduces, indexing, gather, matmul, conv2d and cumsum chained together (with gradients when torch is
installed), each run with no opts, the default heuristic and a random valid opt sequence per kernel, and compared with
torch or numpy. A failure's message is a runnable reproducer."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiny.dtype import dtypes
from tiny.testing.program_fuzz import DTYPES, check_program, default_settings, programs

from ._kit import examples

# one small program per quick run: the fuzzer is the kit's broadest single check
pytestmark = pytest.mark.kit_quick


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), seed=st.integers(0, 2 ** 31 - 1))
def test_random_programs(data, seed, tiny_device, tiny_skip_dtypes):
  # a dtype the device leaves out is never cast to (float32, int32 and bool are needed by every program)
  allowed = [d for d in DTYPES if getattr(dtypes, d) not in tiny_skip_dtypes or d in ("float32", "int32", "bool")]
  prog = data.draw(programs(max_ops=6, max_size=64, dtypes=allowed), label="program")
  check_program(prog, tiny_device, default_settings(seed, n_random=1))
