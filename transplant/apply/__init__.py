"""Apply a plan as a transaction on the target (edge)."""
