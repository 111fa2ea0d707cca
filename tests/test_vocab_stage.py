"""The vocab stage end to end through run_stage, on real legal text with a tiny zh BERT."""

from __future__ import annotations

import contextlib
import csv
import shutil

import pytest
import torch
from tests.test_vocab_helpers import decided, legal_texts, tiny_zh_model, write_corpus
from transformers import AutoModelForMaskedLM, AutoTokenizer

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.vocab.declare import vocab_stage

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731

MIXED = [
    "根据《中华人民共和国合同法》第107条，当事人应当承担违约责任。",
    "ABC公司于2023年12月31日签订合同，金额为￥1,000,000.00元😀",
    "ＦＵＬＬ－ＷＩＤＴＨ　全角字符１２３与半角abc混排",
    "The plaintiff 原告 filed a lawsuit（诉讼）against 被告.",
    "",
    "🙂👍🏽 emoji only",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, sample_raw, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("vocab")
    train = legal_texts(sample_raw, 800) + ["本案涉及㸃字和🙂表情。"] * 3
    valid = legal_texts(sample_raw, 150, offset=5000)
    write_corpus(root / "work" / "prepare" / "domain", train, valid)
    model = tiny_zh_model(zh_tokenizer_dir, root / "base-model")
    gloss = root / "glossary.txt"
    gloss.write_text("不可抗力 100 n\n知识产权\n\n民事法律行为 n\n法\n", encoding="utf-8")
    params = root / "params.yaml"
    params.write_text(
        "model: {base: base-model, tokenizer: %s, language: zh}\n"
        "paths: {work: work, state: state}\n"
        "vocab: {top_k: 300, min_freq: 5, glossaries: [glossary.txt], eval_texts: 32}\n" % zh_tokenizer_dir,
        encoding="utf-8",
    )
    return root, params, model


def _run(params, overrides=(), **kw):
    cfg = load_config(params, overrides=list(overrides))
    return cfg, run_stage(vocab_stage(), decided(cfg), tracker_factory=NO_TRACKING, **kw)


@pytest.fixture(scope="module")
def built(setup):
    root, params, _ = setup
    cfg, res = _run(params)
    return cfg, res


def test_outputs_load_without_bertpipe(built, zh_tokenizer_dir):
    cfg, res = built
    out = res.out
    for f in ("tokenizer/tokenizer.json", "model/config.json", "model/tokenizer.json", "added_tokens.tsv",
              "report.md", "manifest.json", "vocab.png"):
        assert (out / f).is_file(), f
    tok = AutoTokenizer.from_pretrained(out / "model")
    tok2 = AutoTokenizer.from_pretrained(out / "tokenizer")
    model = AutoModelForMaskedLM.from_pretrained(out / "model")
    assert model.get_input_embeddings().weight.shape[0] == len(tok) == len(tok2)
    base = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    assert len(tok) > len(base) + 100
    for t in MIXED:
        assert tok(t)["input_ids"] == tok2(t)["input_ids"]
    with torch.no_grad():
        enc = tok(MIXED[:4], padding=True, return_tensors="pt")
        assert model(**enc).logits.shape[-1] == len(tok)
    # Tied input/output embeddings survive the resize and the save.
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_added_words_are_one_token_and_listed(built):
    cfg, res = built
    tok = AutoTokenizer.from_pretrained(res.out / "tokenizer")
    with open(res.out / "added_tokens.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == res.metrics["added_tokens"]
    words = [r for r in rows if r["kind"] in ("word", "glossary")]
    assert len(words) >= 100
    for r in words:
        assert tok(r["token"], add_special_tokens=False)["input_ids"] == [int(r["id"])], r
        assert int(r["pieces"]) >= 2
    kinds = {r["token"]: r["kind"] for r in rows}
    # Glossary terms are added even when rare; a term already one token (法) is not added again.
    assert kinds.get("不可抗力") == "glossary" and kinds.get("民事法律行为") == "glossary"
    assert "法" not in kinds
    # The corpus character bert-base-chinese lacks becomes a vocab entry.
    assert kinds.get("㸃") == "unk_char"


def test_metrics_and_report(built):
    cfg, res = built
    m = res.metrics
    assert m["tokens_per_char_after"] < m["tokens_per_char_before"]
    assert m["unk_rate_after"] <= m["unk_rate_before"]
    assert m["speed_ratio"] > 0
    report = (res.out / "report.md").read_text(encoding="utf-8")
    assert "tokens per character" in report and "Glossary coverage" in report and "不可抗力" in report


def test_second_run_is_cached(setup, built):
    _, params, _ = setup
    _, res = _run(params)
    assert res.skipped


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["vocab.top_k=-1"], "vocab.top_k"),
        (["vocab.glossaries=[empty.txt]"], "glossary is empty"),
        (["vocab.glossaries=[bad.txt]"], "bad.txt:2"),
        (["model.tokenizer=base-model/config.json"], "not a tokenizer"),
        (["model.tokenizer=nowhere-dir"], "not a tokenizer"),
    ],
)
def test_bad_input_is_one_line_error_and_no_output(setup, overrides, expected):
    root, params, _ = setup
    (root / "empty.txt").write_text("\n  \n", encoding="utf-8")
    (root / "bad.txt").write_text("合同法\n违约 金 10 n\n", encoding="utf-8")
    work = "work-bad-" + str(abs(hash(tuple(overrides))))
    shutil.copytree(root / "work" / "prepare", root / work / "prepare", dirs_exist_ok=True)
    with pytest.raises(BertpipeError) as e:
        _run(params, [*overrides, f"paths.work={work}"])
    assert expected in str(e.value) and "\n" not in str(e.value)
    assert not (root / work / "vocab" / "manifest.json").exists()
