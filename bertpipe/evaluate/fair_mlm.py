"""The encoder comparison that register's encoder gate and the evaluate report share.

INTERFACE STUB (to be replaced by the fair whole-word, per-character comparison): today it is the old per-token
MLM loss on the domain valid split.
"""

from __future__ import annotations


def encoder_gate_score(model_dir, cfg) -> tuple[str, float]:
    """(metric name, value) the register stage gates the encoder on; higher is better."""
    from bertpipe.evaluate.metrics import mlm_perplexity
    from bertpipe.evaluate.stage import _valid_texts
    from bertpipe.pipeline import corpus_dir

    e = cfg.params.evaluate
    texts = _valid_texts(corpus_dir(cfg, "domain"), e.mlm_max_texts)
    loss = mlm_perplexity(model_dir, texts, e.mlm_max_seq_len, e.mlm_mask_prob, e.mlm_batch_size, e.mlm_seed)["loss"]
    return "neg_mlm_loss", -float(loss)
