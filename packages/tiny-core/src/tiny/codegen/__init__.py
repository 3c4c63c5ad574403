"""The kernel compiler: LazyOp AST -> Kernel opts -> UOp graph -> linearized uops."""
