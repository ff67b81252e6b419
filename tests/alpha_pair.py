"""A local donor with alpha 2.0 and a maker of fresh targets holding alpha 1.0, each with its
manifest: the smallest real transplant, for the tests of what surrounds one apply."""

from __future__ import annotations

import subprocess
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path

from transplant.lab.wheels import build_wheel, make_venv


def alpha_pair(base: Path, files: Mapping[str, str], verify: str = "") -> Callable[[str], tuple[Path, Path]]:
    """Build the donor (alpha 2.0: ``__init__.py`` and ``files``, path -> text) and a pristine
    target (alpha 1.0) under ``base``; returns ``target(name) -> (venv, manifest)``, a copy of the
    pristine target at ``base/name`` and ``base/name.yaml`` overlaying alpha, with ``verify``
    (YAML lines) appended."""
    new = build_wheel(base / "wheels", "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", **files})
    old = build_wheel(base / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    donor = make_venv(base / "donor", [new])
    pristine = make_venv(base / "pristine", [old])

    def target(name: str) -> tuple[Path, Path]:
        venv = base / name
        subprocess.run(["cp", "-a", str(pristine), str(venv)], check=True)
        manifest = base / f"{name}.yaml"
        manifest.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {donor}}}
            target: {{host: local, venv: {venv}}}
            overlay: [alpha]
            """) + verify)
        return venv, manifest

    return target
