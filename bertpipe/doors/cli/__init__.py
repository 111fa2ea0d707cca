"""The `bertpipe` command line (Typer app in commands.py; `python -m bertpipe.doors.cli` runs it), `retrain --add`'s
intake, and the torchrun entry point."""
