"""The end of a real pretrain run collects the token stores no output references (beyond the most recent few) and
keeps its own; a store another live process reads stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.test_pretrain_support import TINY_ARCH, law_texts, write_corpus, write_params
from tests.test_tokstore_gc import _key, _open, _release

REPO = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "-m", "bertpipe.doors.cli.torchrun", "--stage", "base", "--no-tracking", "--params"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONPATH": str(REPO)}


def test_pretrain_collects_old_stores_and_keeps_its_own(tmp_path, sample_raw, zh_tokenizer_dir):
    texts = law_texts(sample_raw, 200)
    write_corpus(tmp_path / "work" / "prepare" / "general", texts[:180], texts[180:])
    params = write_params(tmp_path, {"base": "scratch", "tokenizer": str(zh_tokenizer_dir), "language": "zh"},
                          base={"arch": TINY_ARCH, "max_seq_len": 64, "batch_size": 8, "max_steps": 2,
                                "eval_examples": 8, "output": "last"})
    root = tmp_path / "state" / "tokstore"
    for i in range(1, 7):  # old stores of earlier experiments, used long ago (1 least recently)
        _open(root, _key(i))
        os.utime(root / _key(i) / "meta.json", (1e9 + i, 1e9 + i))
    reader = _open(root, _key(1), "lease")  # another process still reads the oldest
    os.utime(root / _key(1) / "meta.json", (1e9, 1e9))  # (opening it made it the most recent: it is not, here)
    try:
        r = subprocess.run(RUN + [str(params)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        _release(reader)
    stores = json.loads((tmp_path / "work" / "base" / "manifest.json").read_text())["counts"]["token_store"]
    own = {rec["key"] for rec in stores.values()}
    left = {p.name for p in root.iterdir() if p.is_dir()}
    # kept: this run's two stores, the 4 most recently used (the run's own two among them, then 6 and 5), the leased 1
    assert left == own | {_key(6), _key(5), _key(1)}, (left, r.stderr[-1500:])
    assert "token stores: removed 3 unused" in r.stderr
