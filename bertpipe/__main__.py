"""`python -m bertpipe`: the `bertpipe` command (how the Prefect flow starts each stage in a process of its own)."""

from bertpipe.doors.cli.commands import main

main()
