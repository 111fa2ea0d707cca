"""The one exception type a user sees: a single line that names the file, line or key and what was expected."""

from __future__ import annotations

import _thread
import signal
import sys
import threading
from pathlib import Path


class BertpipeError(Exception):
    """A user-facing error. The CLI prints ``error: <message>`` and exits with status 2."""

    def __init__(self, message: str):
        # Keep it one line: multi-line messages get folded so the CLI contract holds.
        super().__init__(" ".join(str(message).split()))

    def __reduce__(self):
        # The message alone: a flow persists a failed stage's error (Prefect pickles it; distributed's tblib adds the
        # traceback and the exception it was raised under), and it is rebuilt from its one line.
        return type(self), (str(self),)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so ``finally``/``except BaseException`` blocks clean up as for Ctrl-C
    (a stage's temp dir is removed, its MLflow run is marked KILLED) instead of the process vanishing mid-write."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: see ``Terminated``. One that lands in a finalizer or a weakref callback (a garbage collection
    running when the signal came) is swallowed there by Python ("Exception ignored in ..."), and the process would go
    on to the end of its work: ``_redeliver`` delivers the signal again, to land in the code the process was running."""
    if sys.unraisablehook is not _redeliver:
        _hooks.append(sys.unraisablehook)
        sys.unraisablehook = _redeliver
    raise Terminated(f"terminated by signal {signum}")


_hooks: list = []  # the unraisable hook _redeliver took the place of


def _redeliver(unraisable) -> None:
    _hooks[-1](unraisable)  # printed as before
    if isinstance(unraisable.exc_value, Terminated):
        # a moment later, from another thread: the handler runs in the main thread once this hook and the finalizer
        # have returned (one that lands in a finalizer again is swallowed, and redelivered, again)
        timer = threading.Timer(0.05, _thread.interrupt_main, args=(signal.SIGTERM,))
        timer.daemon = True
        timer.start()


def utf8_error(path: Path | str, err: UnicodeDecodeError | None = None) -> BertpipeError:
    """A decode failure as ``<file>:<line>: not UTF-8 text``. The codec's offset is relative to whatever chunk the
    text layer was decoding, so the line is found again from the file's bytes."""
    path = Path(path)
    where, byte = str(path), None
    try:
        raw = path.read_bytes()
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        where, byte = f"{path}:{line}", raw[e.start]
    except OSError:
        pass
    if byte is None and err is not None and err.object:
        byte = err.object[err.start]
    what = f" (byte 0x{byte:02x})" if byte is not None else ""
    return BertpipeError(f"{where}: expected UTF-8 text{what}; convert it first, e.g. iconv -f GB18030 -t UTF-8")
