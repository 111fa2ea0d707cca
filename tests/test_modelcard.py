"""bertpipe.modelcard on a real tiny encoder: a card Hugging Face's own parser reads back (metadata and body), the
inputs named with their digests, and the directory still loads in a transformers pipeline."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bertpipe import modelcard
from bertpipe.config import load_config
from bertpipe.finetune import synthetic as S


def test_card_round_trips_and_the_dir_still_loads(tmp_path, zh_tokenizer_dir):
    from huggingface_hub import ModelCard
    from transformers import pipeline

    enc = S.tiny_encoder(tmp_path / "model", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    up = tmp_path / "work" / "prepare"
    (up / "domain").mkdir(parents=True)
    (up / "manifest.json").write_text(json.dumps({"fingerprint": "f" * 64}))
    (tmp_path / "params.yaml").write_text("model: {language: zh}\n")
    ctx = SimpleNamespace(cfg=load_config(tmp_path / "params.yaml"), name="pretrain", fingerprint="a" * 64,
                          inputs={"corpus": up / "domain", "model": "bert-base-chinese"})
    path = modelcard.write(enc, ctx, pipeline_tag="fill-mask", base_model="bert-base-chinese",
                           metrics={"eval_loss": 2.5, "note": "not a number"})
    card = ModelCard.load(path)
    assert card.data.base_model == "bert-base-chinese" and card.data.pipeline_tag == "fill-mask"
    assert card.data.language == "zh" and "bertpipe" in card.data.tags and card.data.metrics == ["eval_loss"]
    assert "| eval_loss | 2.5000 |" in card.text and "stage fingerprint ffffffffffffffff" in card.text
    assert "`bert-base-chinese` (hub id)" in card.text
    out = pipeline("fill-mask", model=str(enc))("今天[MASK]气")
    assert len(out) == 5
