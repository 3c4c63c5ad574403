"""Core's built-in devices: PYTHON (the UOp interpreter), DISK and NPY. Hardware devices live in separate packages."""
