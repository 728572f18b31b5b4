"""Shared scenario builders for honk's tests."""
