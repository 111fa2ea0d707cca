"""A tracking server that does not answer: said while it is retried, and given up on within a bounded time.

MLflow retries every REST call with exponential backoff (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, default 7, factor 2:
~4 minutes a call) and says nothing meanwhile; a stage that then closes its run makes more such calls, each as long.
Here, for an ``http(s)://`` tracking URI:

- the pauses between the retries of one call add up to at most ``BERTPIPE_TRACKING_WAIT_S`` seconds (default 60:
  5 retries, 0 + 4 + 8 + 16 + 32 s; ``schedule``), unless the MLFLOW_HTTP_REQUEST_* variables are set;
- each retry prints one line: which call, attempt n/N, the (masked) server and why (urllib3 logs each retry of a
  broken connection: ``urllib3.connectionpool``'s "Retrying ..." warning, turned into that line);
- once a call has given up (``given_up``), the calls that close the failed run try once until the next client is
  opened: the server is gone, and closing the run is best effort (``bertpipe.infra.orphans`` closes it later).
"""

from __future__ import annotations

import logging
import os
import sys
from urllib.parse import urlsplit

WAIT_ENV = "BERTPIPE_TRACKING_WAIT_S"
DEFAULT_WAIT_S = 60
RETRIES = 5
_installed: dict[str, str | None] = {}


def wait_s() -> int:
    try:
        return max(1, int(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S)))
    except ValueError:
        return DEFAULT_WAIT_S


def schedule(wait: int) -> tuple[int, int]:
    """(retries, backoff factor) whose pauses add up to at most ``wait`` s (urllib3 sleeps 0 before the first
    retry, then factor * 2^(k-1) before retry k: factor * (2^R - 2) in all), at most ``RETRIES`` retries."""
    if wait >= 2 ** RETRIES - 2:
        return RETRIES, max(1, wait // (2 ** RETRIES - 2))
    retries = max(1, max(r for r in range(1, RETRIES + 1) if 2 ** r - 2 <= wait))
    return retries, 1


def bound_retries(uri: str) -> None:
    """Bound MLflow's retries for ``uri`` and say each one (see the module docstring)."""
    from bertpipe.infra.redact import mask_uri

    _installed["uri"] = mask_uri(uri)
    if _installed.pop("gave_up", None) is not None:  # a new client (a new stage): the server gets its retries again
        if _installed["gave_up_prev"] is None:
            os.environ.pop("MLFLOW_HTTP_REQUEST_MAX_RETRIES", None)
        else:
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = _installed["gave_up_prev"]
    # every time (a value the user set stays): what was set before may have been removed since
    retries, factor = schedule(wait_s())
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(retries))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", str(factor))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", "0.5")
    if not _installed.get("done"):
        logging.getLogger("urllib3.connectionpool").addFilter(_say_retry)
        _installed["done"] = "1"


def _say_retry(record: logging.LogRecord) -> bool:
    """Turn urllib3's "Retrying (Retry(total=k, ...)) after connection broken by '<error>': <path>" into one line."""
    msg = str(record.msg)
    if not msg.startswith("Retrying (") or not record.args or len(record.args) < 3:
        return True
    retry, err, path = record.args[:3]
    total = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(RETRIES))
    n = len(getattr(retry, "history", ()) or ()) or "?"
    try:
        pause = f"; next try in {retry.get_backoff_time():.0f} s"
    except Exception:  # noqa: BLE001 (a Retry without the method: no pause to tell)
        pause = ""
    why = type(err).__name__ + (f" ({_reason(err)})" if _reason(err) else "")
    print(f"[tracking] {_installed.get('uri', '')} did not answer {urlsplit(str(path)).path or path}: {why}; "
          f"retry {n}/{total}{pause}", file=sys.stderr, flush=True)
    return False  # said once, in bertpipe's words


def _reason(err: BaseException) -> str:
    text = str(err)
    for known in ("Connection refused", "WRONG_VERSION_NUMBER", "wrong version number", "Connection reset",
                  "timed out", "Name or service not known", "Remote end closed connection"):
        if known in text:
            return known
    return ""


def given_up() -> None:
    """A call to the tracking server exhausted its retries: until the next ``bound_retries`` (the next client this
    process opens) each call tries once."""
    if "gave_up" not in _installed:
        _installed["gave_up"], _installed["gave_up_prev"] = "1", os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
