"""Optional extras: a dependency that serves one door only installs with that door (``pip install 'bertpipe[serve]'``).

`scripts/setup.sh` installs every extra, so the demo and the tests stay two commands. A door whose extra is missing
says so in one line (``error: bertpipe models serve needs the 'serve' extra: pip install 'bertpipe[serve]'``, exit 2
through the CLI's ``user_errors``) before anything else runs, instead of an ImportError traceback from deep inside.
The modules are looked up, not imported: importing litserve costs a second the check should not.
"""

from __future__ import annotations

import importlib.util

from bertpipe.infra.errors import BertpipeError

# extra (pyproject.toml [project.optional-dependencies]) -> the top-level modules it provides
EXTRAS = {"serve": ("litserve", "prometheus_client", "fastapi_offline"), "dask": ("prefect_dask",)}


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None  # None too when sys.modules[module] is None
    except (ImportError, ValueError):
        return True


def require(extra: str, door: str) -> None:
    """Raise the one-line error naming ``extra`` when a module of it is not installed; ``door`` is what needs it."""
    if any(_absent(m) for m in EXTRAS[extra]):
        raise BertpipeError(f"{door} needs the '{extra}' extra: pip install 'bertpipe[{extra}]'")
