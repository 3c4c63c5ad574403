"""Fixtures of the conformance kit (the device fixtures come from tiny.testing.pytest_plugin)."""
from tiny.testing.strategies import register_profiles

register_profiles()
