"""Helpers for the torture, fault and isolation tests: a fleet, an operation mix, the invariant checks."""
