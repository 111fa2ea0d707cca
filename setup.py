"""What pyproject.toml cannot say: the Prefect door, the repository's flows/ and tasks/, installs as
bertpipe_prefect.flows and bertpipe_prefect.tasks (``package_dir``), beside bertpipe's packages as found."""

from setuptools import find_namespace_packages, setup

DOOR = {"bertpipe_prefect.flows": "flows", "bertpipe_prefect.tasks": "tasks"}

setup(packages=[*find_namespace_packages(include=["bertpipe", "bertpipe.*"], exclude=["*.__pycache__"]),
                "bertpipe_prefect", *DOOR], package_dir=DOOR)
