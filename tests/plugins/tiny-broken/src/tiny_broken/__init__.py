"""A tiny plugin that fails on import, to test that tiny survives it."""
