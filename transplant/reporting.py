"""The one reporting protocol (base layer): how every long step tells the operator what it does.

An edge (apply, rollback, snapshot, clone, registry push and pull, fleets, verify) takes one
keyword, ``reporter: Reporter``, and calls three methods on it; the face (``cli/``) implements
them once for a terminal and off one. Edges never print and never import the face.

- :meth:`Reporter.note`: a line the operator should read (a stale lock broken, a donor source
  that failed): printed as is, kept in a log.
- :meth:`Reporter.step`: the named step now running (``files``, ``commit``, ``check``, a verify
  stage, "probing the target ..."); it ends when the next one starts or the call returns (verify's
  independent stages overlap: there each step names one more stage running, from its thread). A
  plain call rather than a context manager: every edge today names its steps as it goes, and the
  face shows only the current one (a spinner's text, a bar's label), so a begin/end pair would add
  nothing shown and would re-indent every edge.
- :meth:`Reporter.progress`: how far the current step is, ``done`` of ``total`` in the step's
  unit (bytes for a copy or a blob, items otherwise); ``total`` 0 means not known yet. Within one
  step ``done`` never goes down.

:class:`NullReporter` is quiet (:data:`QUIET`, every edge's default); :class:`RecordingReporter`
keeps the calls in order, for tests and for a face that prints them later; :class:`Prefixed`
adds a host's label to every line (fleets report per host).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["Reporter", "NullReporter", "QUIET", "RecordingReporter", "Prefixed"]


@runtime_checkable
class Reporter(Protocol):
    """What a long step reports (see the module docstring); every method returns None."""

    def note(self, text: str) -> None:
        """A line for the operator (one line, no trailing newline)."""

    def step(self, name: str) -> None:
        """The named step starting now; the previous one, if any, has ended."""

    def progress(self, done: int, total: int) -> None:
        """``done`` of ``total`` (bytes or items; total 0: not known yet) within the current step."""


class NullReporter:
    """Reports nothing: the default of every edge that takes a reporter."""

    def note(self, text: str) -> None:
        pass

    def step(self, name: str) -> None:
        pass

    def progress(self, done: int, total: int) -> None:
        pass


#: The quiet reporter (stateless, so one instance serves every caller).
QUIET: Reporter = NullReporter()


@dataclass
class RecordingReporter:
    """Keeps every call, in order, as ``(kind, ...)`` tuples: ``("note", text)``,
    ``("step", name)``, ``("progress", done, total)``. Thread-safe (fleets report from threads).
    """

    events: list[tuple] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note(self, text: str) -> None:
        with self._lock:
            self.events.append(("note", text))

    def step(self, name: str) -> None:
        with self._lock:
            self.events.append(("step", name))

    def progress(self, done: int, total: int) -> None:
        with self._lock:
            self.events.append(("progress", done, total))

    def steps(self) -> list[str]:
        """The names of the steps, in the order they started."""
        return [e[1] for e in self.events if e[0] == "step"]

    def notes(self) -> list[str]:
        """The notes' texts, in order."""
        return [e[1] for e in self.events if e[0] == "note"]

    def progress_of(self, name: str) -> list[tuple[int, int]]:
        """Every ``(done, total)`` reported while the step ``name`` ran (each time it ran)."""
        out, current = [], None
        for event in self.events:
            if event[0] == "step":
                current = event[1]
            elif event[0] == "progress" and current == name:
                out.append((event[1], event[2]))
        return out


@dataclass(frozen=True)
class Prefixed:
    """Passes every call to ``inner``, with ``prefix`` before each note's and step's text
    (``"gpu-b: "``): one host's reports among a fleet's."""

    inner: Reporter
    prefix: str

    def note(self, text: str) -> None:
        self.inner.note(self.prefix + text)

    def step(self, name: str) -> None:
        self.inner.step(self.prefix + name)

    def progress(self, done: int, total: int) -> None:
        self.inner.progress(done, total)
