"""The controller's own files and state folder (edge)."""
