"""Extending an encoder that was extended before (a retrain from the champion): every earlier id keeps its number,
only new words are added, only their rows are initialised, and no character becomes unknown that was known."""

from __future__ import annotations

import contextlib
import csv
import shutil

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.stages.vocab.declare import vocab_stage
from bertpipe.stages.vocab.embeddings import INITS
from bertpipe.stages.vocab.extend import extend_tokenizer, load_tokenizer, moved_ids, tokenizer_stats, unk_counts
from bertpipe.stages.vocab.mining import unk_forms
from tests.test_vocab_helpers import decided, legal_texts, tiny_zh_model, write_corpus

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731

# New CJK characters (ext-A/B and compatibility), full-width forms, emoji (with modifiers and ZWJ), Latin with
# accents, and words mixing them.
MIXED = [
    "本案涉及㸃字和𠀀字，𪚥为罕见字。",
    "ＦＵＬＬ－ＷＩＤＴＨ　全角字符１２３与半角abc混排，ｐｌａｉｎｔｉｆｆ，Ａ股ｂ股",
    "合同😀👍🏽签订👨‍👩‍👧，金额￥1,000.00元🦜",
    "The plaintiff's indemnification claim failed; Café naïve résumé — “quotes”.",
    "人民法院判决：被告支付违约金㸃𠀀😀ａｂｃ",
    "ab😀cd ｘ𪚥ｙ emoji🦜inside Ｗｏｒｄ",
]
ROUND1_WORDS = ["合同法", "违约金", "当事人", "人民法院"]
ROUND2_WORDS = ["合同法", "知识产权", "不可抗力", "判决书"]


@pytest.fixture(scope="module")
def base(zh_tokenizer_dir):
    return load_tokenizer(zh_tokenizer_dir)


def _reload(tok, path):
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def rounds(base, tmp_path_factory):
    """Round one: words and [UNK] characters of the first half; round two extends round one's (saved and reloaded,
    as an exported champion is) with the rest."""
    tmp = tmp_path_factory.mktemp("tok")
    first = _reload(extend_tokenizer(base, ROUND1_WORDS, [f for f, _ in unk_forms(MIXED[:3], base, 1)]), tmp / "t1")
    second = extend_tokenizer(first, ROUND2_WORDS, [f for f, _ in unk_forms(MIXED, first, 1)])
    return first, second, _reload(second, tmp / "t2")


def test_every_earlier_id_keeps_its_number(base, rounds):
    first, second, reloaded = rounds
    assert moved_ids(base, first) == []
    assert moved_ids(first, second) == [] and moved_ids(first, reloaded) == []
    assert reloaded.get_vocab() == second.get_vocab()
    assert len(second) > len(first) > len(base)
    for w in ROUND1_WORDS:  # earlier words are not added again and keep their single id
        assert second(w, add_special_tokens=False)["input_ids"] == first(w, add_special_tokens=False)["input_ids"]
        assert len(first(w, add_special_tokens=False)["input_ids"]) == 1
    for w in set(ROUND2_WORDS) - set(ROUND1_WORDS):
        ids = reloaded(w, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] >= len(first), w


@pytest.mark.parametrize("text", MIXED)
def test_unknown_characters_never_increase(base, rounds, text):
    first, second, reloaded = rounds
    counts = [unk_counts(t, [text])[2] for t in (base, first, second, reloaded)]
    assert counts == sorted(counts, reverse=True) and counts[2] == counts[3], counts


def test_extension_removes_unknown_characters_and_reports_them_per_character(base, rounds):
    first, second, _ = rounds
    b, f, s = (tokenizer_stats(t, MIXED, repeats=0) for t in (base, first, second))
    assert b["unk_chars"] > f["unk_chars"] > s["unk_chars"]
    assert b["unk_rate"] > f["unk_rate"] > s["unk_rate"]


def test_per_token_unk_rate_rises_when_words_shrink_the_token_count(base):
    # The retrain's "UNK went up" (1.31e-4 -> 1.83e-4): same unknown characters, fewer tokens. The stage
    # reports unknown characters per character, which cannot rise when the vocabulary only grows.
    texts = ["当事人向人民法院请求支付违约金，合同法另有规定的除外。㸃"] * 5
    ext = extend_tokenizer(base, ROUND1_WORDS)
    b, e = tokenizer_stats(base, texts, repeats=0), tokenizer_stats(ext, texts, repeats=0)
    assert b["unk_tokens"] == e["unk_tokens"] > 0
    assert e["unk_token_rate"] > b["unk_token_rate"]
    assert e["unk_rate"] == b["unk_rate"]


def _params(root, tokenizer, extra: str = "") -> object:
    p = root / "params.yaml"
    p.write_text("model: {base: base-model, tokenizer: %s, language: zh%s}\n"
                 "paths: {work: work, state: state}\n"
                 "vocab: {top_k: 60, min_freq: 4, eval_texts: 16, head_fit_steps: 0}\n" % (tokenizer, extra),
                 encoding="utf-8")
    return p


def test_vocab_stage_extends_the_starting_encoder_and_only_its_new_rows(tmp_path, sample_raw, zh_tokenizer_dir):
    root = tmp_path
    tiny_zh_model(zh_tokenizer_dir, root / "base-model")
    old = legal_texts(sample_raw, 300) + MIXED[:1] * 4
    valid = legal_texts(sample_raw, 40, offset=5000) + MIXED
    write_corpus(root / "work" / "prepare" / "domain", old, valid)
    cfg = load_config(_params(root, zh_tokenizer_dir))
    r1 = run_stage(vocab_stage(), decided(cfg), tracker_factory=NO_TRACKING)
    champion = root / "champion"
    shutil.copytree(r1.out / "model", champion)

    # Round two: the grown corpus (new laws, new characters), continuing from round one's encoder.
    write_corpus(root / "work" / "prepare" / "domain", old + legal_texts(sample_raw, 300, offset=2500) + MIXED * 4,
                 valid)
    cfg2 = load_config(_params(root, zh_tokenizer_dir, ", continue_from: champion"))
    r2 = run_stage(vocab_stage(), decided(cfg2), tracker_factory=NO_TRACKING)
    tok1, tok2 = AutoTokenizer.from_pretrained(champion), AutoTokenizer.from_pretrained(r2.out / "model")
    assert moved_ids(tok1, tok2) == [] and len(tok2) > len(tok1)
    with open(r2.out / "added_tokens.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert rows and all(int(r["id"]) >= len(tok1) for r in rows)
    assert not {r["token"] for r in rows} & set(tok1.get_vocab())  # new words only
    assert {r["token"] for r in rows} & {"𪚥", "😀"}  # the new characters arrived
    # Only the new rows were initialised: every earlier row (and output bias) is the champion's, bit for bit.
    m1, m2 = AutoModelForMaskedLM.from_pretrained(champion), AutoModelForMaskedLM.from_pretrained(r2.out / "model")
    e1, e2 = m1.get_input_embeddings().weight, m2.get_input_embeddings().weight
    assert e2.shape[0] == len(tok2) and torch.equal(e2[: len(tok1)], e1[: len(tok1)])
    assert torch.equal(m2.get_output_embeddings().bias[: len(tok1)], m1.get_output_embeddings().bias[: len(tok1)])
    assert m2.config.bertpipe_lineage["start"] == {"kind": "path", "path": str(champion)}
    # The init was chosen on held-out text among every candidate, and the comparison is in the manifest and report.
    m = r2.metrics
    scored = {i: m[f"mlm_loss_{i}"] for i in INITS}
    assert m["init"] == min(scored, key=scored.get)
    assert m["unk_rate_after"] <= m["unk_rate_before"] and m["unk_tokens_after"] < m["unk_tokens_before"]
    report = (r2.out / "report.md").read_text(encoding="utf-8")
    assert f"initialised with **{m['init']}**" in report and "mean_cov init" in report and "champion" in report


def test_eval_length_beyond_the_model_positions_is_clamped(tmp_path, sample_raw, zh_tokenizer_dir, capsys):
    from transformers import BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=32)).save_pretrained(tmp_path / "base-model")
    tok.save_pretrained(tmp_path / "base-model")
    texts = legal_texts(sample_raw, 200)
    assert max(len(t) for t in texts) > 64  # longer than the 32 positions: unclamped, the loss would crash
    write_corpus(tmp_path / "work" / "prepare" / "domain", texts, texts[:20])
    cfg = load_config(_params(tmp_path, zh_tokenizer_dir), overrides=["vocab.eval_max_length=512"])
    res = run_stage(vocab_stage(), decided(cfg), tracker_factory=NO_TRACKING)
    assert res.metrics["init"] in INITS and res.metrics["added_tokens"] > 0
    assert "vocab.eval_max_length=512 exceeds the model's 32 positions" in capsys.readouterr().err
