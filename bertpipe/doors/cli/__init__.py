"""The `bertpipe` command line (the Typer app in commands.py; `python -m bertpipe` runs it too), `retrain --add`'s
intake, and the torchrun entry point."""
