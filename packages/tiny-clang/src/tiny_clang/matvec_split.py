"""Which vector-matrix products the CPU renderers ask `Tensor.dot` to split along the reduce (`Renderer.matvec_split`).

`x @ W` with one row of x and a row-major W (GPT-2's decode step: every linear layer) reads each weight once, so it runs
at the pace the core streams W from L3/DRAM. Its kernel keeps a strip of output columns in vector accumulators and walks
the whole reduce for that strip, reading a few hundred bytes of every row of W, then the next strip: one short piece of
each row after another, which the hardware prefetchers (they follow runs within a 4 KiB page, and the next page) barely
help, so the core is left with the few lines its own misses keep in flight. Split into blocks of `block` rows instead,
`(x_blocks * W_blocks).sum(block)` writes one partial sum per block and column (1/block of W's size, which stays in L2)
and `.sum(blocks)` adds them up (the bias, gelu and residual fuse into that second kernel). The first kernel's strip loop
now sits inside a block, so it walks `block` whole rows side by side: `block` sequential streams the prefetchers follow.
Its outer loop runs over the blocks, so the threads split the reduce (each streams its own rows).

Measured in a C harness of both loop orders (one thread, CPU time, 24 different 768x3072 float matrices on 2 MiB pages,
the loaded 2-vCPU AVX-512 Xeon, 3 rounds): one strip at a time 9.9-10.6 GB/s; blocks of 4 rows 11.0-11.4, 8 rows
12.9-13.2, 16 rows 13.1-13.7, 32 rows 13.6-13.7 (both kernels); a single pass over whole rows with the sums in memory
13.7-13.8. Strips of 16, 24 or 192 vectors (spilled) instead reached 10.7-12.1. Products whose W is small enough to sit
in L2 gain nothing and pay a second kernel, so W must be at least MIN_BYTES.
"""
from __future__ import annotations

from tiny.backend import DType, dtypes

# W below this stays in L2 (2 MiB a core on the Xeon above) between calls or streams too briefly to matter
MIN_BYTES = 2 * 1024 * 1024
# rows per block, largest first: 16 and 32 measured alike; a block count of at least MIN_BLOCKS keeps both threads busy
BLOCKS = (32, 16, 8)
MIN_BLOCKS = 8


def split_block(simd_bytes: int, m: int, k: int, n: int, dtype: DType) -> int:
  """`Renderer.matvec_split` for a CPU with simd_bytes-wide vectors: rows of W per block of the reduce, or 0 (no split).

  Only one row of x (a batch of rows reuses each strip of W from cache and has its own tiles), float32, W at least
  MIN_BYTES, and n a whole number of 4-vector strips (the width tiny_clang.heuristics.matvec_strip upcasts)."""
  if dtype != dtypes.float32 or simd_bytes < 16 or m != 1 or k * n * dtype.itemsize < MIN_BYTES:
    return 0
  if n % (4 * simd_bytes // dtype.itemsize) != 0:
    return 0
  return next((b for b in BLOCKS if k % b == 0 and k // b >= MIN_BLOCKS), 0)
