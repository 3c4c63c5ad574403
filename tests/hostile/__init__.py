"""Hostile weight files for tiny_nn.state's loaders (generated at test time, never stored as binary blobs)."""
