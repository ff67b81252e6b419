"""Recover a known-good state and read a target's status (edge)."""
