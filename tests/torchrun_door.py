"""The pretrain stage launcher (``bertpipe.doors.cli.torchrun``) called in the test process, for the runs of the
torchrun tests whose process is no part of the claim (a reference run, a rerun): it spares each the ~5 CPU-s a new
process spends importing torch, transformers and the stage's libraries. The runs a signal or torchrun reaches stay
processes of their own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def launch_here(argv: list[str | Path], env: dict[str, str], capfd) -> subprocess.CompletedProcess:
    """``python -m bertpipe.doors.cli.torchrun *argv`` run in this process with ``env``'s variables set: its exit
    status and output (``capfd``'s, from the call alone). Torch's thread count, which the stage sets, is restored."""
    import torch

    from bertpipe.doors.cli.torchrun import main

    args, threads = [str(a) for a in argv], torch.get_num_threads()
    capfd.readouterr()
    try:
        with pytest.MonkeyPatch.context() as mp:  # env's variables set for the call, restored afterwards
            for k, v in env.items():
                mp.setenv(k, v)
            rc = main(args)
    finally:
        torch.set_num_threads(threads)
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)
