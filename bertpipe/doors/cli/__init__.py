"""The `bertpipe` command line (the Typer app in commands.py; `python -m bertpipe` runs it too) and the torchrun
entry point."""
