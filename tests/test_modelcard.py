"""bertpipe.modelcard on a real tiny encoder: a card Hugging Face's own parser reads back (metadata and body), the
inputs named with their digests, the Hub metadata a user expects (metric values as model-index, datasets, license,
the base model as params.yaml names it), and the directory loads in a transformers pipeline that truncates a text
longer than the model's position table."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bertpipe import modelcard
from bertpipe.pipeline import load_config
from tests import synthetic as S


def test_card_round_trips_and_the_dir_still_loads(tmp_path, zh_tokenizer_dir):
    from huggingface_hub import ModelCard
    from transformers import pipeline

    enc = S.tiny_encoder(tmp_path / "model", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    up = tmp_path / "work" / "prepare"
    (up / "domain").mkdir(parents=True)
    (up / "manifest.json").write_text(json.dumps({"fingerprint": "f" * 64}))
    (tmp_path / "params.yaml").write_text("model: {language: zh, base: bert-base-chinese}\n")
    ctx = SimpleNamespace(cfg=load_config(tmp_path / "params.yaml"), name="pretrain", fingerprint="a" * 64,
                          inputs={"corpus": up / "domain", "model": "bert-base-chinese"})
    path = modelcard.write(enc, ctx, pipeline_tag="fill-mask", base_model=str(tmp_path / "work" / "base" / "model"),
                           metrics={"eval_loss": 2.5, "note": "not a number"})
    card = ModelCard.load(path)
    assert card.data.base_model == "bert-base-chinese" and card.data.pipeline_tag == "fill-mask"
    assert card.data.language == "zh" and "bertpipe" in card.data.tags and card.data.metrics == ["eval_loss"]
    assert "| eval_loss | 2.5000 |" in card.text and "stage fingerprint ffffffffffffffff" in card.text
    assert "`bert-base-chinese` (hub id)" in card.text and "Built from `work/base/model`" in card.text
    assert card.data.license == "other" and card.data.datasets == ["work/prepare/domain"]
    result = card.data.eval_results[0]
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("loss", 2.5, "eval")
    assert "model-index" in path.read_text(encoding="utf-8")
    out = pipeline("fill-mask", model=str(enc))("今天[MASK]气")
    assert len(out) == 5
    # the tokenizer was saved with 512 tokens, the model has 64 positions: the card's writer fits the first to the
    # second, so a long text truncates instead of failing on a tensor size mismatch
    long = pipeline("feature-extraction", model=str(enc))("很好" * 300, truncation=True)
    assert len(long[0]) == 64


def test_a_scratch_base_has_no_base_model_and_a_local_base_lends_its_license(tmp_path, zh_tokenizer_dir):
    from huggingface_hub import ModelCard

    enc = S.tiny_encoder(tmp_path / "model", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("---\nlicense: apache-2.0\n---\n# mine\n")
    for base, want in (("scratch", (None, "other")), ("mine", ("mine", "apache-2.0"))):
        (tmp_path / "params.yaml").write_text(f"model: {{language: zh, base: {base}}}\n")
        ctx = SimpleNamespace(cfg=load_config(tmp_path / "params.yaml"), name="base", fingerprint="a" * 64,
                              inputs={})
        card = ModelCard.load(modelcard.write(enc, ctx, pipeline_tag="fill-mask", base_model=""))
        assert (card.data.base_model, card.data.license) == want
