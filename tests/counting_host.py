"""A local host that notes which host scripts the commands it starts run (for tests that count
the stage processes a verify starts)."""

from __future__ import annotations

from transplant import remote
from transplant.hosts.host import LocalHost


class Counting(LocalHost):
    """This machine, noting which host script each command it starts runs (``scripts``, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []

    def _note(self, argv, stdin) -> None:
        self.scripts += [name for name in remote.SCRIPTS
                         if stdin == remote.source(name) or remote.source(name).decode() in argv]

    def run(self, argv, *, stdin=None, env=None, timeout=None):
        self._note(argv, stdin)
        return super().run(argv, stdin=stdin, env=env, timeout=timeout)

    def spawn(self, argv, *, env=None, stdin=None, stdout=None):
        self._note(argv, None)
        return super().spawn(argv, env=env, stdin=stdin, stdout=stdout)
