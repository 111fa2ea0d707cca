"""Opening and decoding corpus source files: the one place prepare and `retrain --add` open a source.

``open_regular`` refuses anything but a regular file: reading a FIFO blocks until a writer appears (forever, in a
pipeline run that has already opened its MLflow run), and a device such as /dev/zero never ends.

``text_lines`` decodes a text file incrementally (chunks cut at line ends, so memory does not grow with the file).
The encoding policy (``SourceParams.encoding``):

- ``auto``: UTF-8 (a BOM is stripped), else GB18030. A file is one encoding: a file whose lines are partly UTF-8 and
  partly GB18030 is an error naming the first line that disagrees (decoding it all as GB18030 would store the UTF-8
  lines as mojibake). A chunk that is nearly all valid UTF-8 but has an invalid sequence is broken UTF-8, an error,
  not GB18030.
- ``per-line``: each line on its own: UTF-8 when it is valid UTF-8, else GB18030 (for concatenated sources).
  ``ingest.Ingest.counts`` records how many lines were read as GB18030 this way.
- ``utf-8``, ``utf-8-sig``, ``gb18030``: strict.

A NUL byte is an error (a binary or UTF-16 file). Line ends are ``\\n``, ``\\r\\n`` or ``\\r``.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from bertpipe.infra.errors import BertpipeError

CHUNK_BYTES = 4 << 20
_NON_ASCII = re.compile(rb"[\x80-\xff]")
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refuse(path: Path | str, mode: int, key: str) -> BertpipeError:
    where = f"{key}: " if key else ""
    return BertpipeError(f"{where}{path}: expected a regular file, found {_kind(mode)} (copy its content to a file)")


def regular_file(path: Path | str, key: str = "") -> Path:
    """``path`` when it is a regular file (symlinks followed); one-line error otherwise. Opens nothing."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise BertpipeError(f"{key + ': ' if key else ''}{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode, key)
    return Path(path)


def is_special(path: Path) -> bool:
    """Neither a regular file nor a directory (what a directory listing must not silently skip or read)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def open_regular(path: Path | str, key: str = "") -> BinaryIO:
    """Open ``path`` for binary reading, refusing a non-regular file without blocking on it: O_NONBLOCK makes
    opening a FIFO return at once, and the check is on the opened descriptor, so nothing can swap the file between
    the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise BertpipeError(f"{key + ': ' if key else ''}{path}: cannot open ({e.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, mode, key)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# ---------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self, path: Path | str, encoding: str, counts: dict | None):
        self.path, self.encoding, self.counts = path, encoding, counts
        self.mode: str | None = None  # auto: the file's encoding, once a non-ASCII line decided it
        self.mode_line = 0

    def _where(self, line: int, offset: int) -> str:
        return f"{self.path}:{line}: byte offset {offset}: "

    def chunk(self, data: bytes, line: int, offset: int) -> str:
        """Decode ``data`` (whole lines starting at ``line``, byte ``offset``)."""
        nul = data.find(b"\x00")
        if nul >= 0:
            raise BertpipeError(self._where(line + data.count(b"\n", 0, nul), offset + nul)
                                + "expected text, found a NUL byte (binary or UTF-16 file?)")
        enc = self.encoding
        if enc not in ("auto", "per-line"):
            try:
                return data.decode(enc)
            except UnicodeDecodeError as e:
                raise BertpipeError(self._where(line + data.count(b"\n", 0, e.start), offset + e.start)
                                    + f"expected {enc} text") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            if enc == "auto":
                non_ascii = len(data) - len(data.decode("ascii", "ignore"))
                if data.decode("utf-8", "replace").count("\ufffd") < 0.02 * non_ascii:
                    raise BertpipeError(self._where(line + data.count(b"\n", 0, e.start), offset + e.start)
                                        + "expected UTF-8 text (invalid byte sequence)") from None
            return self._by_line(data, line, offset)
        m = _NON_ASCII.search(data)
        if m is not None:
            self._agree("UTF-8", line + data.count(b"\n", 0, m.start()), offset + m.start())
        return text

    def _agree(self, enc: str, line: int, offset: int) -> None:
        if self.encoding != "auto":
            return
        if self.mode is None:
            self.mode, self.mode_line = enc, line
        elif self.mode != enc:
            raise BertpipeError(
                self._where(line, offset) + f"this line is {enc} but line {self.mode_line} is {self.mode} (mixed "
                "encodings in one file); convert the file to one encoding, or set the source's encoding: per-line")

    def _by_line(self, data: bytes, line: int, offset: int) -> str:
        out: list[str] = []
        for n, raw in enumerate(data.split(b"\n")):
            try:
                text = raw.decode("utf-8")
                if _NON_ASCII.search(raw):
                    self._agree("UTF-8", line + n, offset)
            except UnicodeDecodeError as e:
                try:
                    text = raw.decode("gb18030")
                except UnicodeDecodeError:
                    raise BertpipeError(self._where(line + n, offset + e.start) + "expected UTF-8 or GB18030 text "
                                        "(set `encoding` if it is another)") from None
                self._agree("GB18030", line + n, offset)
                if self.counts is not None and self.encoding == "per-line":
                    self.counts["gb18030_lines"] = self.counts.get("gb18030_lines", 0) + 1
            out.append(text)
            offset += len(raw) + 1
        return "\n".join(out)


def text_lines(fh: BinaryIO, path: Path | str, encoding: str = "auto", counts: dict | None = None,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[str]:
    """The decoded lines of ``fh``, exactly ``whole_text.split("\\n")`` after line-end normalisation, read in
    chunks of about ``chunk_bytes``."""
    dec = _Decoder(path, encoding, counts)
    carry = b""
    line, offset = 1, 0
    first = True
    while True:
        block = fh.read(chunk_bytes)
        data = carry + block
        if first:
            first = False
            if data.startswith(b"\xef\xbb\xbf") and encoding in ("auto", "per-line", "utf-8-sig"):
                data, offset = data[3:], 3
                if encoding == "auto":
                    dec.encoding = "utf-8"  # a BOM says UTF-8 for the whole file
            elif encoding == "utf-8-sig":
                dec.encoding = "utf-8"
        if block:
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                carry = data
                continue
            data, carry = data[:cut], data[cut:]
        text = dec.chunk(data, line, offset)
        line += data.count(b"\n")
        offset += len(data)
        # Chunks end just after a "\n", so a "\r\n" is never cut in two.
        parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        if block:
            parts.pop()  # the empty string after the chunk's final "\n"
            yield from parts
        else:
            yield from parts
            return
