"""Clone a venv to another path or host (edge)."""
