"""bertpipe.lib.modelcard on a real tiny encoder: a card Hugging Face's own parser reads back (metadata and body), the
inputs named with their digests, the Hub metadata a user expects (metric values as model-index, datasets, license,
the base model as params.yaml names it), and the directory loads in a transformers pipeline that truncates a text
longer than the model's position table."""

from __future__ import annotations

import json
from types import SimpleNamespace

from bertpipe.graph.pipeline import load_config
from bertpipe.lib import modelcard
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
    # the Hub's spec: `other` names the license and links a file in the repo; datasets and dataset.type are ids
    assert (card.data.license, card.data.license_name, card.data.license_link) == ("other", "unstated", "LICENSE.md")
    assert "not stated" in (enc / "LICENSE.md").read_text(encoding="utf-8") and card.data.datasets == ["domain"]
    result = card.data.eval_results[0]
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("loss", 2.5, "eval")
    assert (result.dataset_type, result.dataset_name) == ("domain", "work/prepare/domain")
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


LONG_TEXT = "张三在北京大学工作，今天天气很好。" * 118  # 2,006 characters: far past 64 tokens


def _card_code(readme) -> str:
    text = readme.read_text(encoding="utf-8")
    return text.split("## How to load", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def _run_card(model_dir, tmp_path, task, pipeline_tag: str, max_seq_len: int) -> dict:
    """The card written for ``model_dir`` and its "How to load" code executed as a user runs it (the example call
    included), with the path filled in; returns the code's names."""
    (tmp_path / "params.yaml").write_text("model: {language: zh, base: bert-base-chinese}\n")
    ctx = SimpleNamespace(cfg=load_config(tmp_path / "params.yaml"), name="finetune/t/adapted", fingerprint="a" * 64,
                          inputs={"task": tmp_path / "work" / "splits" / "t"})
    path = modelcard.write(model_dir, ctx, pipeline_tag=pipeline_tag, base_model="bert-base-chinese",
                           metrics={"test_f1": 0.5}, task=task, max_seq_len=max_seq_len)
    code = _card_code(path)
    assert code.count('"path/to/this/dir"') == 1
    names: dict = {}
    exec(compile(code.replace('"path/to/this/dir"', repr(str(model_dir))), str(path), "exec"), names)
    card = __import__("huggingface_hub").ModelCard.load(path)
    assert card.data.datasets == ["t"] and card.data.eval_results[0].dataset_type == "t"
    return names


def _headed(out, zh_tokenizer_dir, head: str, labels: list[str]):
    import torch
    import transformers

    from transformers import AutoTokenizer, BertConfig

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(zh_tokenizer_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=512, id2label=dict(enumerate(labels)),
                     label2id={lab: i for i, lab in enumerate(labels)})
    model = getattr(transformers, head)(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return model


def test_the_classifier_cards_code_reads_a_long_text_as_serving_does(tmp_path, zh_tokenizer_dir):
    """A 2,000-character text: the card's code runs (no position overflow) and gives serving's label and score,
    for head_tail truncation (cut from both ends) and for windows voted over."""
    from bertpipe.lib.inference.predictor import Predictor
    from bertpipe.lib.training.params import TaskParams

    labels = ["neg", "pos", "mid"]
    model_dir = tmp_path / "cls"
    _headed(model_dir, zh_tokenizer_dir, "BertForSequenceClassification", labels)
    got = {}
    for how in ("head_tail", "window", "head"):
        task = TaskParams(type="classification", format="jsonl", train="t.jsonl", truncation=how, head_tokens=16,
                          stride=40, window_aggregate="vote" if how == "window" else "mean")
        names = _run_card(model_dir, tmp_path, task, "text-classification", 64)
        meta = {"type": "classification", "labels": labels, "max_seq_len": 64,
                **task.model_dump(include={"truncation", "head_tokens", "stride", "window_aggregate"})}
        served = Predictor(model_dir, meta).predict([{"text": LONG_TEXT}])[0]
        got[how] = names["classify"](LONG_TEXT)
        assert got[how]["label"] == served["label"] and abs(got[how]["score"] - served["score"]) < 1e-5, how
    assert got["head_tail"]["score"] != got["head"]["score"]  # the ends of the text matter: not a head cut


def test_the_ner_cards_code_finds_entities_over_the_whole_long_text(tmp_path, zh_tokenizer_dir):
    """The token-classification card's pipeline (windows of the training length, an aggregation strategy) returns
    the entities to the last character of a 2,000-character text, as serving does."""
    import torch

    from bertpipe.lib.inference.predictor import Predictor
    from bertpipe.lib.training.params import TaskParams

    labels = ["O", "B-LOC", "I-LOC"]
    model = _headed(tmp_path / "ner", zh_tokenizer_dir, "BertForTokenClassification", labels)
    with torch.no_grad():  # every character a one-character LOC: what is found shows what the windows covered
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.0, 1.0, 0.0]))
    model.save_pretrained(tmp_path / "ner")
    task = TaskParams(type="ner", format="jsonl", train="t.jsonl", stride=40)
    names = _run_card(tmp_path / "ner", tmp_path, task, "token-classification", 64)
    found = {(e["start"], e["end"], e["entity_group"]) for e in names["pipe"](LONG_TEXT)}
    served = Predictor(tmp_path / "ner", {"type": "ner", "labels": labels, "max_seq_len": 64, "stride": 40}
                       ).predict([{"text": LONG_TEXT}])[0]
    assert max(end for _, end, _ in found) == len(LONG_TEXT) and len(found) == len(LONG_TEXT)
    assert found == {(e["start"], e["end"], e["label"]) for e in served}


def test_the_qa_and_pair_cards_code_runs_on_a_long_context(tmp_path, zh_tokenizer_dir):
    """The QA card's code answers over every window of a 2,000-character context with serving's answer and score;
    the pair classifier's pipeline call truncates as training does (longest first)."""
    from bertpipe.lib.inference.predictor import Predictor
    from bertpipe.lib.training.params import TaskParams

    _headed(tmp_path / "qa", zh_tokenizer_dir, "BertForQuestionAnswering", ["start", "end"])
    task = TaskParams(type="qa", format="squad", train="t.json", doc_stride=24, max_query_len=16, max_answer_len=8)
    names = _run_card(tmp_path / "qa", tmp_path, task, "question-answering", 64)
    got = names["answer"]("谁在北京工作？", LONG_TEXT)
    served = Predictor(tmp_path / "qa", {"type": "qa", "labels": [], "max_seq_len": 64, "doc_stride": 24,
                                         "max_query_len": 16, "max_answer_len": 8, "n_best": 64}
                       ).predict([{"question": "谁在北京工作？", "context": LONG_TEXT}])[0]
    assert got["answer"] == LONG_TEXT[got["start"]:got["end"]] and got["answer"]
    assert (got["answer"], got["start"]) == (served["answer"], served["start"])
    assert abs(got["score"] - served["score"]) < 1e-5
    _headed(tmp_path / "pair", zh_tokenizer_dir, "BertForSequenceClassification", ["same", "diff"])
    pair = TaskParams(type="pair_classification", format="jsonl", train="t.jsonl")
    names = _run_card(tmp_path / "pair", tmp_path, pair, "text-classification", 64)
    out = names["pipe"]({"text": LONG_TEXT, "text_pair": LONG_TEXT}, truncation="longest_first", max_length=64)
    served = Predictor(tmp_path / "pair", {"type": "pair_classification", "labels": ["same", "diff"],
                                           "max_seq_len": 64}).predict([{"text": LONG_TEXT, "text_pair": LONG_TEXT}])[0]
    assert out["label"] == served["label"] and abs(out["score"] - served["score"]) < 1e-5
