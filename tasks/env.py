"""Prefect's environment for one project: state under ``paths.state``, quiet, offline-friendly.

Entry points call ``prefect_env(cfg)`` before the flow starts (the CLI's run/retrain/serve, the flows' ``main``);
importing a flow or task module sets nothing. Prefect reads its settings once at import, so when it is already
imported the global settings are re-read here (PREFECT_HOME decides where the temporary server keeps its database
and where task results are cached). Variables the user already exported win.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def prefect_env(cfg=None) -> Path:
    """Set Prefect's environment for ``cfg`` (a ``bertpipe.infra.config.Config``; None: $BERTPIPE_ROOT or the cwd, with
    the default state dir). Returns PREFECT_HOME."""
    if cfg is not None:
        state = Path(cfg.state)
    else:
        state = Path(os.environ.get("BERTPIPE_ROOT") or Path.cwd()) / ".bertpipe"
    home = state.resolve() / "prefect"
    os.environ.setdefault("PREFECT_HOME", str(home))
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "true")
    os.environ.setdefault("PREFECT_LOGGING_LOG_PRINTS", "true")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "prefect.context" in sys.modules:
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    return home
