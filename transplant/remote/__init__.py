"""Scripts that run on the hosts, each one stdlib-only file sent to the venv's interpreter.

The controller reads their text with :func:`source` and pipes it to
``<venv>/bin/python -``; it never imports them. Each prints one JSON document.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["source", "SCRIPTS", "ISOLATED"]

SCRIPTS = ("probe", "applier", "stage_imports", "stage_server_args", "stage_smoke", "elf_facts", "stage_native",
           "stage_provenance", "stage_serve", "stage_jit", "relocate", "oci_pull")


#: Scripts that only read (or write files) and never import the venv's distributions: they run
#: with ``-I -S``, so none of the venv's ``.pth`` code runs and nothing is written there.
ISOLATED = ("probe", "elf_facts", "applier", "relocate", "oci_pull")


def source(name: str) -> bytes:
    """The bytes of the host script ``name`` (one of :data:`SCRIPTS`).

    :raises ValueError: an unknown name.
    """
    if name not in SCRIPTS:
        raise ValueError(f"unknown host script {name!r}; expected one of {SCRIPTS}")
    return resources.files(__name__).joinpath(f"{name}.py").read_bytes()
