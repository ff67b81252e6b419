"""transplant: move working CUDA Python environments between GPU hosts.

``plan`` inventories a donor and a target venv over SSH and says what would change and
what would break; ``apply`` copies exactly what differs; ``verify`` proves the target
works. See README.md and manifests/REFERENCE.md.
"""

__version__ = "0.1.0"
