"""`python -m bertpipe.doors.cli`: the `bertpipe` command (how the flow starts a stage process)."""

from bertpipe.doors.cli.commands import main

main()
