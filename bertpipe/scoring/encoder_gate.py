"""The score register gates an encoder on: minus the NLL per masked character on the domain test split, over the
windows of the test split's store (``windows.open_windows``). Its own module because it joins the scorer
(``fair_mlm``) and the window store (``windows``, which builds from ``fair_mlm``'s window choice): in either of those
it would make an import cycle."""

from __future__ import annotations

from bertpipe.modelinfo import clamp_seq_len
from bertpipe.scoring.fair_mlm import eval_device, score_windows, summarize, window_chars
from bertpipe.scoring.windows import open_windows


def encoder_gate_score(model_dir, cfg) -> tuple[str, float]:
    """(metric name, value) the register stage gates the encoder on; higher is better: minus the NLL per masked
    character on the domain test split. The window length also respects the base encoder's positions, so challenger
    and champion scored with one config read the same text (and the same window store)."""
    from bertpipe.layout import base_model, corpus_dir

    e = cfg.params.evaluate
    max_chars = window_chars(e.mlm_max_seq_len, [model_dir, base_model(cfg)])
    windows, _ = open_windows(corpus_dir(cfg, "domain"), e, max_chars, cfg.state)
    max_len = clamp_seq_len(e.mlm_max_seq_len, model_dir, "evaluate.mlm_max_seq_len")
    summary = summarize(score_windows(model_dir, windows, max_len, e.mlm_batch_size, device=eval_device(e)), windows)
    return "neg_nll_per_char", -float(summary["nll_per_char"])
