"""The one place that masks credentials in URIs before anything is printed, logged, tagged or written.

A tracking URI may carry ``user:password@`` (``https://alice:s3cret@mlflow.example``, also via $MLFLOW_TRACKING_URI)
or a token in its query string. bertpipe needs the raw URI only to connect; every copy meant for a person or a
file (the run summary, error lines, MLflow params and tags, manifests, registry.json, reports) goes through
``mask_uri`` (one URI) or ``mask_text`` (free text that may quote one, e.g. an MLflow error message).
Imports nothing heavy, so any module can use it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# Query parameters whose value is a secret (``?token=…``, ``&sig=…``, ``password=`` in a DB URI's options).
_SECRET_KEY = r"[^=&;?#\s]*(?:password|passwd|pwd|token|secret|key|auth|credential|signature)[^=&;?#\s]*"
_SECRET_QUERY = re.compile(rf"([?&;]{_SECRET_KEY}=)[^&;#\s'\"]*", re.I)
# scheme://userinfo@ inside free text (userinfo: anything up to the last '@' before the host part ends).
_USERINFO = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^\s/?#@'\"<>]+@", re.I)


def mask_uri(uri: str) -> str:
    """``uri`` fit to print or store: userinfo (``https://user:secret@host``) is dropped, and so is the value of a
    query parameter that looks like a credential. Anything else is left exactly as written."""
    try:
        netloc = urlsplit(uri).netloc
    except ValueError:
        return "<unparseable URI>"
    if "@" in netloc:
        uri = uri.replace("//" + netloc, "//" + netloc.rsplit("@", 1)[1], 1)
    return _SECRET_QUERY.sub(r"\1***", uri)


def mask_text(text: str) -> str:
    """Every URI quoted in ``text`` masked as ``mask_uri`` does (for messages that embed one: MLflow's
    "API request to https://user:pw@host/... failed", a traceback line, a log record)."""
    if "://" not in text:
        return text
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1", text))
