"""Verify: the ladder, how each stage is judged, and the runner (edge)."""
