"""The engine: scheduling LazyBuffer graphs into kernels (schedule), running them (realize), JIT and BEAM search."""
