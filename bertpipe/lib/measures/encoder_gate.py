"""The score register gates an encoder on: minus the NLL per masked character on the domain test split, over the
windows of the test split's store (``windows.open_windows``) that the encoder fits.

The evaluate stage scores the base and the adapted encoder on those windows for its comparison, and records each
one's gate score in ``metrics.json`` (``encoder_comparison.gate``) under a key (``gate_key``) of everything the
number depends on: the model's content digest (as a stage fingerprints an input), the window store's key, the
sequence length, batch size and device of the scoring, the scoring code (``codeid.module_digest``) and the model
libraries' versions. Register reads the number when its own key for the model is the same (``gate_score``), and
scores the model itself otherwise (a champion exported from the registry, a project without the evaluate output).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from bertpipe.core.codeid import MODEL_LIBS, lib_versions, module_digest
from bertpipe.lib.keyedstore import store_key
from bertpipe.lib.measures.fair_mlm import eval_device, score_windows, summarize, window_chars
from bertpipe.lib.measures.windows import key_parts, open_windows
from bertpipe.lib.modelinfo import clamp_seq_len

METRIC = "neg_nll_per_char"


def _plan(model_dir, cfg) -> tuple[int, int]:
    """(window characters, max tokens) of ``model_dir``'s gate score. The window length also respects the base
    encoder's positions, so challenger and champion scored with one config read the same text (and the same window
    store)."""
    from bertpipe.lib.layout import base_model

    e = cfg.params.evaluate
    max_chars = window_chars(e.mlm_max_seq_len, [model_dir, base_model(cfg)])
    return max_chars, clamp_seq_len(e.mlm_max_seq_len, model_dir, "evaluate.mlm_max_seq_len")


def encoder_gate_score(model_dir, cfg) -> tuple[str, float]:
    """(metric name, value) the register stage gates the encoder on, scored here; higher is better."""
    from bertpipe.lib.layout import corpus_dir

    e = cfg.params.evaluate
    max_chars, max_len = _plan(model_dir, cfg)
    windows, _ = open_windows(corpus_dir(cfg, "domain"), e, max_chars, cfg.state)
    summary = summarize(score_windows(model_dir, windows, max_len, e.mlm_batch_size, device=eval_device(e)), windows)
    return METRIC, -float(summary["nll_per_char"])


def gate_key(model_digest: str, windows_key: str, max_len: int, e) -> str:
    """The identity of one gate score: the model (its content digest), the windows (their store key) and how they
    were scored. ``e``: the evaluate params."""
    parts = {"model": model_digest, "windows": windows_key, "max_len": int(max_len),
             "batch_size": int(e.mlm_batch_size), "device": eval_device(e), "code": module_digest((__name__,)),
             "libs": lib_versions(MODEL_LIBS)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def model_key(model_dir, cfg) -> str:
    """``gate_key`` of ``model_dir`` scored with ``cfg``'s evaluate params, without scoring anything."""
    from bertpipe.core.stage import content_digest
    from bertpipe.lib.layout import corpus_dir

    e = cfg.params.evaluate
    max_chars, max_len = _plan(model_dir, cfg)
    windows_key = store_key(key_parts(corpus_dir(cfg, "domain"), e, max_chars))
    return gate_key(content_digest(model_dir, cfg), windows_key, max_len, e)


def recorded(metrics: Path, key: str) -> float | None:
    """The gate score an evaluate ``metrics.json`` recorded under ``key``, or None."""
    try:
        gate = json.loads(Path(metrics).read_text(encoding="utf-8"))["encoder_comparison"]["gate"]
        found = [r[METRIC] for r in gate.values() if r.get("key") == key]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return float(found[0]) if found else None


def gate_score(model_dir, cfg, evaluate_dir: Path | None) -> tuple[str, float, bool]:
    """(metric name, value, read from evaluate?): the score evaluate recorded for this very model, windows and
    scoring (``evaluate_dir/metrics.json``), else the model scored here."""
    if evaluate_dir is not None:
        value = recorded(Path(evaluate_dir) / "metrics.json", model_key(model_dir, cfg))
        if value is not None:
            return METRIC, value, True
    return (*encoder_gate_score(model_dir, cfg), False)
