"""Fleets: one manifest on many targets (edge)."""
