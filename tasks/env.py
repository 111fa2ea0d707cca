"""Prefect's environment, set before prefect is imported: state inside the project, quiet, offline-friendly."""

from __future__ import annotations

import os
from pathlib import Path


def prefect_env(root: Path | str | None = None) -> None:
    root = Path(root or os.environ.get("BERTPIPE_ROOT") or Path.cwd()).resolve()
    home = root / ".bertpipe" / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_LOGGING_LOG_PRINTS", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
