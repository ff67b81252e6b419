"""What a fresh interpreter has loaded after importing some of transplant's modules (for the tests
that keep a command's early path light: what it imports before its host scripts start)."""

from __future__ import annotations

import subprocess
import sys


def loaded_after(imports: list[str], heavy: list[str]) -> list[str]:
    """The modules of ``heavy`` present in ``sys.modules`` of a new interpreter (this one's
    executable and path) once it has imported ``imports``, in the order given."""
    code = (f"import sys\nfor name in {imports!r}:\n    __import__(name)\n"
            f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return out.split(",") if out else []
