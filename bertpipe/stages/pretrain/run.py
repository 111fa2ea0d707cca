"""Run the `base` or `pretrain` stage in every process of a torchrun job.

    torchrun --nproc_per_node=2 -m bertpipe.doors.cli.torchrun --stage pretrain [--params params.yaml] [--set k=v ...]

(``bertpipe.doors.cli.torchrun`` is that command's entry point: it loads the params and looks the stage up in the graph,
then calls ``run`` here.)

Several nodes (a c10d rendezvous) and elastic restarts (``--max-restarts``: the group restarts after a rank dies and
resumes from the last checkpoint): docs/distributed.md, whose command tests/test_pretrain_elastic.py runs.

Rank 0 goes through ``run_stage`` as a single process would (fingerprint, output lock, MLflow run, atomic rename,
manifest). The other ranks must not: they would block on rank 0's output lock while rank 0 waits for them in the
first collective. They compute the same fingerprint, hence the same ``scratch`` dir, and call the same ``build`` with
a throwaway ``out`` and no tracker; ``build`` lets only rank 0 write. Without torchrun this is plain ``run_stage``.

Every door (``bertpipe run``, the Prefect flow, ``dvc repro``) reaches ``run`` through the stage's launcher, so this
is also where one process per visible GPU starts: with ``nproc: auto`` (base/pretrain params) and more than one GPU,
``run`` relaunches the stage as ``torchrun --standalone --nproc_per_node=<GPUs>`` and waits; with no GPU or one,
nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bertpipe.infra.errors import BertpipeError


def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def visible_gpus() -> int:
    """CUDA devices this process may use (CUDA_VISIBLE_DEVICES narrows them); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_nproc(setting: int | str, gpus: int) -> int:
    """Processes for ``nproc``: ``auto`` is one per visible GPU, and 1 with none or one; a number is taken as is
    (N CPU processes with gloo, e.g. to test DDP)."""
    if setting == "auto":
        return gpus if gpus > 1 else 1
    return max(1, int(setting))


def torchrun_command(stage_name: str, n: int, launch_args: tuple, force: bool, tracking: bool) -> list[str]:
    """The torchrun command line that runs ``stage_name`` in ``n`` processes with the same params."""
    params, profile, overrides = launch_args
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "-m", "bertpipe.doors.cli.torchrun", "--stage", stage_name]
    if params is not None:
        cmd += ["--params", params]
    if profile is not None:
        cmd += ["--profile", profile]
    for o in overrides:
        cmd += ["--set", o]
    return cmd + (["--force"] if force else []) + ([] if tracking else ["--no-tracking"])


def _launch(stage, cfg, n: int, force: bool, tracking: bool):
    """Run the stage under torchrun in ``n`` processes; the result is read from the manifest rank 0 wrote."""
    import subprocess

    from bertpipe.core.stage import StageResult, is_fresh, read_manifest

    cmd = torchrun_command(stage.name, n, cfg.launch_args, force, tracking)
    print(f"[{stage.name}] {n} processes (one per visible GPU): {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait()
    except BaseException:  # SIGTERM/Ctrl-C to us: stop the job too (torchrun stops its ranks)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        raise
    if rc != 0:
        raise BertpipeError(f"{stage.name}: torchrun with {n} processes failed (exit {rc}); its output is above")
    fresh, fp = is_fresh(stage, cfg)
    m = read_manifest(stage.output(cfg)) or {}
    if not fresh:
        raise BertpipeError(f"{stage.name}: torchrun finished but {stage.output(cfg)} is not fresh")
    return StageResult(stage.name, stage.output(cfg), fp, False, m.get("metrics", {}), m.get("mlflow_run_id"))


def run(stage, cfg, force: bool = False, tracker_factory=None):
    """``run_stage`` that also works in every rank of a torchrun job (returns None on ranks > 0)."""
    from bertpipe.core.stage import StageContext, fingerprint, read_manifest, run_stage, scratch_dir

    rank, world = _rank()
    section = stage.params_section or stage.sections[0]
    if "LOCAL_RANK" not in os.environ and getattr(cfg, "launch_args", None) is not None:
        n = resolve_nproc(getattr(cfg.section(section), "nproc", 1), visible_gpus())
        if n > 1:
            return _launch(stage, cfg, n, force, tracking=tracker_factory is None)
    if world == 1 or rank == 0:
        return run_stage(stage, cfg, force=force, tracker_factory=tracker_factory)
    fp, _ = fingerprint(stage, cfg)
    m = read_manifest(stage.output(cfg))
    if not force and m is not None and m.get("fingerprint") == fp:
        return None  # rank 0 skips too
    with tempfile.TemporaryDirectory(prefix=f"bertpipe-{stage.name.replace('/', '_')}-rank{rank}-") as tmp:
        ctx = StageContext(stage.name, cfg, cfg.section(section), stage.inputs(cfg), Path(tmp), scratch_dir(stage, cfg, fp),
                           fp, None)
        stage.build(ctx)
    return None
