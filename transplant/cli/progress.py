"""Progress of long steps (face), on a terminal and off one (CI, a log file, ``| tee``).

On a terminal a step shows a spinner and a byte transfer a bar (rich; one line that fits the width,
its columns dropped before any figure is cut: :class:`FittedByteProgress`). Off a terminal rich
shows nothing, so a step of minutes would be silent; there every step prints plain lines
instead: when it starts, every :data:`EVERY` seconds how far it is, and when it ends with its
seconds; the copy's bytes at most every :data:`COPY_EVERY` seconds, as they pass 25, 50 and
75 %, and once when the copy is over. A byte transfer's bar has a fixed total (the plan's bytes), its rate and the time
left, and names the steps after the copy (the commit, the check) while they run.

Both are the face's side of the one reporting protocol (:class:`transplant.reporting.Reporter`):
:class:`Shown` sends an edge's notes and steps where a command shows them (a printed line, a
spinner's text), :class:`ByteProgress` is apply's reporter (the bar).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, Task, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["step", "Shown", "StagesShown", "printer", "ByteProgress", "FittedByteProgress", "byte_line_parts",
           "EVERY", "COPY_EVERY"]

#: Seconds between two plain progress lines off a terminal.
EVERY = 30.0

#: Off a terminal, the copy prints a line at most this often (seconds), and also as it passes
#: 25, 50 and 75 %, and once when it is done.
COPY_EVERY = 10.0


def _plain(console: Console, line: str) -> None:
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def printer(console: Console, **options: Any) -> Callable[[str], None]:
    """``line -> console.print(line, markup=False, **options)``: a note or step as a plain line."""
    return lambda line: console.print(line, markup=False, **options)


class Shown:
    """A :class:`transplant.reporting.Reporter` for one command: each note goes to ``note`` and
    each step's name to ``step`` (a printer, a spinner's ``update``), or nowhere when None;
    progress is not shown (the spinner counts seconds; apply's bytes are :class:`ByteProgress`'s).
    Safe to call from several threads (verify's stages overlap): one call at a time reaches
    ``note`` and ``step``, so two lines never interleave.
    """

    def __init__(self, *, note: Callable[[str], None] | None = None, step: Callable[[str], None] | None = None):
        self._note, self._step = note, step
        self._lock = threading.Lock()

    def note(self, text: str) -> None:
        if self._note is not None:
            with self._lock:
                self._note(text)

    def step(self, name: str) -> None:
        if self._step is not None:
            with self._lock:
                self._step(name)

    def progress(self, done: int, total: int) -> None:
        pass


class StagesShown:
    """A :class:`transplant.reporting.Reporter` for steps that overlap (verify's stages): each
    step and each progress sends ``update`` one line naming the steps running now (started and
    not yet ended, in the order they started) and how many of those that run have ended
    (``verify: imports, native-load (1 of 9 done)``; ``verify: 7 of 9 done`` between two).
    Safe to call from several threads.

    Besides the protocol's three methods it has ``ended(name)``, which an edge whose steps
    overlap calls as each ends (:func:`transplant.verify.runner.run_stages` does); a step never
    said to have ended stays named until the next step starts after every one has.

    :param update: where the line goes (a spinner's ``update``).
    :param label: the line's start (``verify``).
    """

    def __init__(self, update: Callable[[str], None], label: str) -> None:
        self._update, self._label = update, label
        self._lock = threading.Lock()
        self._running: list[str] = []
        self._done, self._total = 0, 0

    def note(self, text: str) -> None:
        with self._lock:
            self._update(text)

    def step(self, name: str) -> None:
        with self._lock:
            self._running.append(name)
            self._show()

    def ended(self, name: str) -> None:
        """The step ``name`` has ended: it is no longer named (shown with the next progress)."""
        with self._lock:
            if name in self._running:
                self._running.remove(name)

    def progress(self, done: int, total: int) -> None:
        with self._lock:
            self._done, self._total = done, total
            self._show()

    def _show(self) -> None:
        count = f"{self._done} of {self._total} done" if self._total else ""
        if self._running:
            self._update(f"{self._label}: {', '.join(self._running)}" + (f" ({count})" if count else ""))
        else:
            self._update(f"{self._label}: {count}" if count else self._label)


@contextmanager
def step(console: Console, label: str, *, count: Callable[[], str] | None = None) -> Iterator[Callable[[str], None]]:
    """Show ``label`` while the block runs; yields ``update(text)`` to say what it does now.

    :param count: called for the periodic lines off a terminal (``"3 of 5 packages"``), or None.
    Off a terminal: ``label ...`` at the start, ``label: <now> (<count>), N s`` every
    :data:`EVERY` seconds, and ``label: done in N s`` (or ``failed after N s``) at the end.
    """
    started = time.monotonic()
    if console.is_terminal:  # a spinner, what it does now, and the seconds so far
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      transient=True) as shown:
            task = shown.add_task(label, total=None)
            yield lambda text: shown.update(task, description=f"{label}: {text}")
        return
    now = {"text": ""}
    stop = threading.Event()
    _plain(console, f"{label} ...")

    def tick() -> None:
        while not stop.wait(EVERY):
            extra = [now["text"]] if now["text"] else []
            if count is not None:
                extra.append(count())
            _plain(console, f"{label}: {', '.join(extra) + ', ' if extra else ''}{time.monotonic() - started:.0f} s")

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    ok = False
    try:
        yield lambda text: now.__setitem__("text", text)
        ok = True
    finally:
        stop.set()
        ticker.join(timeout=1)
        _plain(console, f"{label}: {'done in' if ok else 'failed after'} {time.monotonic() - started:.1f} s")


class ByteProgress:
    """apply's copy, then its commit and check: one bar of ``total`` bytes (fixed: the plan's).

    The reporter :func:`transplant.apply.execute` is given (:class:`transplant.reporting.Reporter`):
    the steps ``files`` and ``patches`` with rsync's own (done, total), which grows while rsync
    scans, so it is mapped onto this bar's share of that step (``shares``); the steps ``commit``
    and ``check`` as they start; each note printed as a line. Each call comes down to
    ``report(step, done, total)`` (commit and check with (0, 0)). Use it as a context manager.

    :param shares: bytes of each copy step (``{"files": donor bytes, "patches": patch bytes}``).
    """

    def __init__(self, console: Console, total: int, shares: dict[str, int]) -> None:
        self.console, self.total, self.shares = console, max(total, 1), shares
        self.started = time.monotonic()
        self._last = self.started
        self._quarter = 0  # off a terminal: the last quarter (1 to 3) a line was printed for
        self._completed: int | None = None  # bytes copied as last reported (None: no copy reported)
        self._shown: int | None = None  # off a terminal: the bytes the last copy line printed
        self._began: float | None = None  # off a terminal: when the copy's first bytes were reported
        self._final = False  # off a terminal: the copy's last line was printed
        self._progress: Progress | None = None
        self._task = TaskID(0)  # read only beside _progress, which add_task sets it with
        self._step: str | None = None
        self._current = ""  # the step the protocol's progress belongs to

    def __enter__(self) -> ByteProgress:
        if self.console.is_terminal:
            self._progress = FittedByteProgress(console=self.console, transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("copying", total=self.total)
        else:
            _plain(self.console, f"copying {self._human(self.total)} ...")
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc_info)

    @staticmethod
    def _human(count: float) -> str:
        from transplant.core.units import human_bytes
        return human_bytes(int(count))

    def note(self, text: str) -> None:
        """A notice (a stale lock broken, a registry pull, how a copy went), printed as a line.

        Off a terminal, a note during the copy first prints the copy's line at the bytes copied so
        far when that figure was not printed yet, so that a copy step's summary never comes ahead
        of the progress it sums up (it came before the last ``copying: 100%``)."""
        if self._progress is None and self._completed is not None and not self._final \
                and self._completed != self._shown:
            self._final = self._completed >= self.total
            self._line(self._completed, time.monotonic())
        self.console.print(text, markup=False)

    def step(self, name: str) -> None:
        """``files``, ``patches`` (their bytes follow), ``commit``, ``check``."""
        self._current = name
        if name in ("commit", "check"):
            self.report(name, 0, 0)

    def progress(self, done: int, total: int) -> None:
        """Bytes of the current copy step."""
        self.report(self._current, done, total)

    def report(self, step: str, done: int, total: int) -> None:
        """The callback (see the class docstring)."""
        if step in ("commit", "check"):
            text = {"commit": "committing: renaming the staged files into place",
                    "check": "checking every path against the plan"}[step]
            if self._progress is not None:
                self._progress.update(self._task, description=text, completed=self.total)
            elif step != self._step:
                if self._completed is not None and not self._final:  # the copy is over: its last line
                    self._final = True
                    if self._completed != self._shown:  # (unless a note just printed it)
                        self._line(self._completed, time.monotonic())
                _plain(self.console, f"{text} ...")
            self._step = step
            return
        before = self.shares.get("files", 0) if step == "patches" else 0  # the patches are copied after the files
        share = self.shares.get(step, 0)
        completed = min(self.total, before + (share * done // total if total > 0 else 0))
        if self._progress is not None:
            self._progress.update(self._task, description=f"copying {step}", completed=completed)
            return
        first = self._completed is None
        self._completed = completed
        if self._final:
            return
        now = time.monotonic()
        if first:  # the copy's first bytes: the periodic lines and the rate count from here, not from the
            self._last = self._began = now  # bar's making (the lock and re-probe before it made its first line
            # "0% (4 B of ...)" at once, and lowered the rate)
        quarter = min(3, 4 * completed // self.total)
        done = completed >= self.total
        if done or quarter > self._quarter or now - self._last >= COPY_EVERY:
            self._quarter, self._final = max(quarter, self._quarter), done
            self._line(completed, now)

    def _line(self, completed: int, now: float) -> None:
        """Off a terminal: ``copying: 45% (450 B of 1000 B), 90 B/s, 5 s``: the seconds and the rate
        since the copy's first bytes (what the copy's summary counts; the lock and re-probe before
        it are not copying)."""
        self._last, self._shown = now, completed
        copying = now - (self._began if self._began is not None else self.started)
        rate = completed / copying if copying > 0 else 0
        _plain(self.console, f"copying: {100 * completed // self.total}% ({self._human(completed)} of "
                             f"{self._human(self.total)}), {self._human(rate)}/s, {copying:.0f} s")


#: The narrowest bar worth drawing (columns); below it the bar is dropped, not the figures.
_BAR_MIN = 10

#: Columns a step's name may claim before a figure is dropped to make room for it; a longer name is
#: shortened (``committing: renaming the st…``) where the figures need its room.
_DESCRIPTION_CLAIM = 28


def _clock(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def byte_line_parts(task: Task, width: int) -> tuple[str, int, list[str]]:
    """How one byte bar's line fits ``width`` columns: (description, bar columns, figures).

    Every figure is in bytes of binary units, the rate too (``3.3 GiB of 9.0 GiB``, ``1.2
    GiB/s``): one unit family on the bar (rich's columns put ``GiB`` beside ``GB/s``). What does
    not fit is dropped whole, never cut inside: first the elapsed time, then the time left, the
    rate, the bar (below :data:`_BAR_MIN` columns) and the percentage; the done-of-total figure
    stays, and the description is shortened (ending in ``…``) only when that alone is too wide.

    :returns: the description to show, the bar's width in columns (0: no bar), and the figures
        in their order (``["3.3 GiB of 9.0 GiB", "37%", "1.2 GiB/s", "0:00:05 left", "0:00:03"]``,
        less those dropped).
    """
    from transplant.core.units import human_bytes

    total = task.total or 0
    done = min(task.completed, total) if total else task.completed
    amounts = f"{human_bytes(int(done))} of {human_bytes(int(total))}"
    percent = f"{100 * done // total:.0f}%" if total else None
    rate = f"{human_bytes(int(task.speed))}/s" if task.speed else None
    left = _clock(task.time_remaining)
    elapsed = _clock(task.elapsed)
    # the optional parts, in the order they are given up (the first goes first)
    optional = {"elapsed": elapsed, "left": f"{left} left" if left else None, "rate": rate, "bar": "", "percent": percent}
    description = str(task.description)

    # a long step name (the commit's) claims at most this much before a figure is dropped for it
    claimed = min(len(description), _DESCRIPTION_CLAIM)

    def used(kept: Mapping[str, str | None], bar: int, words: int) -> int:
        figures = [amounts] + [v for k, v in kept.items() if k != "bar" and v]
        return words + 1 + sum(len(f) + 1 for f in figures) - 1 + (bar + 1 if "bar" in kept else 0)

    kept = {k: v for k, v in optional.items() if v is not None}
    for drop in ("elapsed", "left", "rate", "bar", "percent"):
        if used(kept, _BAR_MIN, claimed) <= width:
            break
        kept.pop(drop, None)
    bar = 0
    if "bar" in kept:  # the room the whole name leaves is the bar's (at most 40 columns, as rich's own bar),
        # and at least _BAR_MIN: it fits beside the claimed part of the name (the loop above saw to it)
        bar = max(_BAR_MIN, min(40, width - used(kept, 0, len(description))))
    figures = [amounts] + [kept[k] for k in ("percent", "rate", "left", "elapsed") if kept.get(k)]
    room = width - (sum(len(f) + 1 for f in figures) - 1) - (bar + 1 if bar else 0) - 1
    if len(description) > room:  # only words go: the figures keep every digit
        description = description[:max(room - 1, 0)].rstrip() + "…" if room > 1 else ""
    return description, bar, figures


class FittedByteProgress(Progress):
    """rich's Progress drawing each task as one byte bar's line that fits the console's width
    (:func:`byte_line_parts`): at 80 columns rich's own columns were squeezed into cells and cut
    their figures (``9.0/…``, ``0:00:…``) onto a second line."""

    def __init__(self, *, console: Console, transient: bool = True) -> None:
        self._fitted_to = console  # rich asks for the first frame inside its own __init__
        super().__init__(console=console, transient=transient)

    def make_tasks_table(self, tasks: Iterable[Task]) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        width = self._fitted_to.width
        table = Table.grid(padding=(0, 1), expand=False)
        rows = []
        for task in tasks:
            if not task.visible:
                continue
            description, bar, figures = byte_line_parts(task, width)
            cells: list[Any] = [Text(description, no_wrap=True, overflow="crop")]
            if bar:
                cells.append(ProgressBar(total=task.total, completed=task.completed, width=bar,
                                         pulse=not task.started, animation_time=task.get_time()))
            cells.append(Text(" ".join(figures), no_wrap=True, overflow="crop"))
            rows.append(cells)
        columns = max((len(r) for r in rows), default=0)
        for _ in range(columns):
            table.add_column(no_wrap=True)
        for cells in rows:
            table.add_row(*cells)
        return table
