"""A third-party-style tiny plugin: the EXAMPLE device, backed by core's Python interpreter."""
