"""The Prefect door under a name of bertpipe's: ``bertpipe_prefect.flows`` and ``bertpipe_prefect.tasks`` are the
repository's top-level flows/ and tasks/, so a project's own flows/ or tasks/ (the cwd is first on sys.path for
``python -m`` and Prefect's runner) never shadows them. An installed wheel holds them in this folder (setup.py's
``package_dir``); in a checkout, or a copy of one, they stand beside it, and the folder above joins this package's
path."""

from pathlib import Path

if not (Path(__file__).parent / "flows").is_dir():  # a checkout: flows/ and tasks/ beside this folder
    __path__.append(str(Path(__file__).resolve().parents[1]))
