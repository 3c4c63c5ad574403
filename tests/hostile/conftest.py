"""Hypothesis profiles for the hostile-file tests: 'default' is fast (CI), HYPOTHESIS_PROFILE=fuzz runs long."""
from tiny.testing.strategies import register_profiles

register_profiles()
