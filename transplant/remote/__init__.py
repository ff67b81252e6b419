"""Scripts that run on the hosts, each one stdlib-only file sent to the venv's interpreter.

The controller reads their text with :func:`source` and pipes it to
``<venv>/bin/python -``; it never imports them. Each prints one JSON document. What several
scripts share (RECORD's hash form, pip's script head, the venv's prefix) is ``_common.py``,
sent ahead of each script that imports it.
"""

from __future__ import annotations

from importlib import resources

__all__ = ["source", "SCRIPTS", "STAGE_SCRIPTS", "ISOLATED", "WATCHED", "OWN_WATCH", "SHARED_MODULE"]

def _stage_scripts() -> tuple[str, ...]:
    """The verify stages' host scripts: every ``stage_*.py`` of this package, by name (sorted),
    so a new stage's script is sent without being listed here."""
    return tuple(sorted(entry.name[:-3] for entry in resources.files(__name__).iterdir()
                        if entry.name.startswith("stage_") and entry.name.endswith(".py")))


#: The verify stages' scripts (``stage_*.py``), found in this package.
STAGE_SCRIPTS = _stage_scripts()

SCRIPTS = ("probe", "applier", "elf_facts", "relocate", "oci_pull", "stream_send", "stream_receive", "pull_key",
           *STAGE_SCRIPTS)


#: Scripts that only read (or write files) and never import the venv's distributions: they run
#: with ``-I -S``, so none of the venv's ``.pth`` code runs and nothing is written there. No stage
#: script is one: a stage imports what the venv holds, as its programs do.
ISOLATED = ("probe", "elf_facts", "applier", "relocate", "oci_pull", "stream_send", "stream_receive", "pull_key")

#: Stage scripts that start their own watch instead of the prelude's: ``stage_serve`` first stops
#: its server.
OWN_WATCH = ("stage_serve",)

#: Read-only scripts that end once nothing reads their output (the controller gone, or given up on
#: them: Ctrl-C during ``verify``), by ``end_when_unread`` of ``_common.py``, started by the prelude
#: :func:`source` puts ahead of them: the probe and every stage script but those of :data:`OWN_WATCH`.
WATCHED = ("probe", *(name for name in STAGE_SCRIPTS if name not in OWN_WATCH))


def source(name: str) -> bytes:
    """The bytes of the host script ``name`` (one of :data:`SCRIPTS`): with the prelude that
    registers the shared module when the script imports it or is :data:`WATCHED`.

    :raises ValueError: an unknown name.
    """
    if name not in SCRIPTS:
        raise ValueError(f"unknown host script {name!r}; expected one of {SCRIPTS}")
    code = resources.files(__name__).joinpath(f"{name}.py").read_bytes()
    if name in WATCHED:
        return _shared_prelude(watch=True) + code
    return _shared_prelude() + code if SHARED_MODULE.encode() in code else code


#: The name the shared module (``_common.py``) is registered under on a host.
SHARED_MODULE = "_transplant_common"


def _shared_prelude(*, watch: bool = False) -> bytes:
    """Lines that register ``_common.py``'s source as the module :data:`SHARED_MODULE`, so the
    script after them imports it on a host where nothing of transplant is installed; with
    ``watch``, they also start its ``end_when_unread`` (:data:`WATCHED`) when the script runs as
    ``__main__`` (the imports script execs the provenance and native-load scripts' sources under
    other names: those start no watch of their own)."""
    shared = resources.files(__name__).joinpath("_common.py").read_text(encoding="utf-8")
    return (f"import sys as _sys, types as _types\n"
            f"_shared = _types.ModuleType({SHARED_MODULE!r})\n"
            f"exec(compile({shared!r}, 'transplant/remote/_common.py', 'exec'), _shared.__dict__)\n"
            f"_sys.modules[{SHARED_MODULE!r}] = _shared\n"
            + ("if __name__ == '__main__':  # run as the script (not exec'd by another, as the imports script does)\n"
               "    _shared.end_when_unread()  # the controller gone or given up: end, with what this started\n"
               if watch else "")
            + "del _sys, _types, _shared\n").encode("utf-8")
