"""A tiny plugin built for a plugin API tiny-core does not provide, to test the refusal."""
