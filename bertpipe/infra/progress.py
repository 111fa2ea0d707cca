"""Progress output fit for where it goes. A terminal gets tqdm's bars (each redrawn at most every 2 s: their
``mininterval``). A file or a pipe (``bertpipe finetune 2> log``, a stage process the flow relays into its log file
and the Prefect UI) gets whole lines instead: a bar's carriage-return redraws become one line per ``LINE_EVERY_S``
seconds at most, so a long run's log stays a few lines per minute, not megabytes on one line. Imports nothing
heavy."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

LINE_EVERY_S = 10.0  # seconds between two lines of one bar in a file or pipe


class Lines:
    """Text written to a stream, passed on as whole lines to ``emit`` (without their newline). Complete lines go
    at once; a line redrawn with carriage returns (a progress bar) goes as its latest drawing, at most once per
    ``every_s``; a blank drawing (a bar erasing itself) goes nowhere."""

    def __init__(self, emit: Callable[[str], None], every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic):
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.partial = ""  # the current line, not yet ended by "\n" or "\r" (or ending in a held "\r")
        self.last_redraw = float("-inf")

    def feed(self, text: str) -> None:
        text = self.partial + text
        held = "\r" if text.endswith("\r") else ""  # it may be the first half of a "\r\n" split between writes
        text = text[: len(text) - len(held)].replace("\r\n", "\n")
        start = 0
        for i, ch in enumerate(text):
            if ch == "\n":
                self.emit(text[start:i])
            elif ch == "\r":
                drawn = text[start:i]
                if drawn.strip() and self.clock() - self.last_redraw >= self.every_s:
                    self.emit(drawn.rstrip())
                    self.last_redraw = self.clock()
            else:
                continue
            start = i + 1
        self.partial = text[start:] + held

    def close(self) -> None:
        """Pass on what is left of the current line (a process that ended without a newline)."""
        if self.partial.strip():
            self.emit(self.partial.rstrip())
        self.partial = ""


class _LineStream:
    """A text stream in front of ``sys.stderr`` that writes through ``Lines`` (one writer at a time: the flow's
    stage threads share it)."""

    def __init__(self, stream):
        self._stream = stream
        self._lines = Lines(self._write_line)
        self._lock = threading.Lock()

    def _write_line(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

    def write(self, text: str) -> int:
        with self._lock:
            self._lines.feed(text)
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def close_lines(self) -> None:
        with self._lock:
            self._lines.close()
        self._stream.flush()

    def __getattr__(self, name: str):  # fileno, encoding, errors, ...: the real stream's
        return getattr(self._stream, name)


def lines_unless_terminal() -> None:
    """When stderr is not a terminal, put ``_LineStream`` in front of it (once), so progress bars drawn from this
    process (its stages' and the libraries') reach the file or pipe as occasional whole lines."""
    import atexit

    err = sys.stderr
    if err is None or isinstance(err, _LineStream) or err.isatty():
        return
    sys.stderr = _LineStream(err)
    atexit.register(sys.stderr.close_lines)
