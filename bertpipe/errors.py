"""The one exception type a user sees: a single line that names the file, line or key and what was expected."""


class BertpipeError(Exception):
    """A user-facing error. The CLI prints ``error: <message>`` and exits with status 2."""

    def __init__(self, message: str):
        # Keep it one line: multi-line messages get folded so the CLI contract holds.
        super().__init__(" ".join(str(message).split()))
