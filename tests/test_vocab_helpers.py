"""Builders shared by the vocab tests (no tests here): a prepared corpus from real legal text and a tiny zh BERT."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.corpus import law_texts as legal_texts  # noqa: F401


def write_corpus(d: Path, train: list[str], valid: list[str]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for name, texts in (("train", train), ("valid", valid), ("test", valid[:5])):
        n = len(texts)
        pq.write_table(
            pa.table(
                {
                    "id": [f"{name}-{i}" for i in range(n)],
                    "text": texts,
                    "group": ["g"] * n,
                    "source": ["china_law"] * n,
                    "cluster": list(range(n)),
                }
            ),
            d / f"{name}.parquet",
        )
    return d


def tiny_zh_model(tokenizer_dir: Path, out: Path, seed: int = 0) -> Path:
    """A small random BertForMaskedLM over the real bert-base-chinese vocab, saved with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
    )
    model = BertForMaskedLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def decided(cfg):
    """``cfg`` after the start stage wrote where pretraining starts (the vocab stage's ``start`` input)."""
    import contextlib

    from bertpipe.core.stage import run_stage
    from bertpipe.stages.start.declare import start_stage

    run_stage(start_stage(), cfg, tracker_factory=lambda *a: contextlib.nullcontext())
    return cfg
