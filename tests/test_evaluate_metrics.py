"""Metrics: classification, strict entity-level NER, CMRC-style QA, and held-out MLM perplexity on real tiny models."""

from __future__ import annotations

import math

import pytest
import torch

from bertpipe.evaluate import metrics as M

torch.set_num_threads(1)


def test_classification_metrics_by_hand():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    flat, det = M.classification_metrics(gold, pred, ["a", "b", "c", "never"])
    assert flat["accuracy"] == pytest.approx(4 / 6)
    # a: p 1, r 2/3 -> f1 0.8; b: p 1/2, r 1/2 -> 0.5; c: p 1/2, r 1 -> 2/3; "never" has no support: left out
    assert flat["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert det["confusion"]["matrix"] == [[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert det["per_class"]["c"]["recall"] == 1.0 and det["per_class"]["never"]["support"] == 0


def test_ner_metrics_are_strict_entity_level():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]  # ORG boundary wrong: no credit
    flat, det = M.ner_metrics(gold, pred)
    assert flat["precision"] == pytest.approx(2 / 3) and flat["recall"] == pytest.approx(2 / 3)
    assert flat["f1_ORG"] == 0.0 and flat["f1_PER"] == 1.0 and det["per_type"]["LOC"]["support"] == 1
    # strict mode: an entity starting with I- is not an entity at all
    flat, _ = M.ner_metrics([["B-PER", "I-PER"]], [["I-PER", "I-PER"]])
    assert flat["f1"] == 0.0


@pytest.mark.parametrize(
    "pred, answers, em, f1",
    [
        ("北京", ["北京"], 1.0, 1.0),
        ("北京。", ["北京"], 1.0, 1.0),  # punctuation ignored
        ("北京市", ["北京"], 0.0, 0.8),  # character-level: p 2/3, r 1
        ("上海", ["北京"], 0.0, 0.0),
        ("Patent Law", ["patent law"], 1.0, 1.0),  # English words are units, case-folded
        ("2021年6月1日", ["2021年6月1日起"], 0.0, 2 * 1 * (6 / 7) / (1 + 6 / 7)),  # units: 2021 年 6 月 1 日
        ("专利权人", ["专利权人的合法权益", "专利权人"], 1.0, 1.0),  # best over references
        ("", ["北京"], 0.0, 0.0),
        ("😀北京", ["北京"], 0.0, 2 * (2 / 3) * 1 / (2 / 3 + 1)),  # the emoji is one unit
    ],
)
def test_qa_exact_match_and_char_f1(pred, answers, em, f1):
    flat, _ = M.qa_metrics([pred], [answers])
    assert flat["exact_match"] == pytest.approx(em) and flat["f1"] == pytest.approx(f1)


def test_qa_unanswerable_examples_are_not_scored():
    flat, det = M.qa_metrics(["a", "b"], [["a"], []])
    assert flat == {"exact_match": 1.0, "f1": 1.0} and det["unanswerable_skipped"] == 1


def test_perplexity_drops_after_training_on_the_text(tmp_path, zh_tokenizer_dir):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from bertpipe.finetune.synthetic import tiny_encoder

    texts = ["中华人民共和国专利法保护专利权人的合法权益。"] * 8
    enc = tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    before = M.mlm_perplexity(enc, texts, max_len=32, seed=3)
    assert before == M.mlm_perplexity(enc, texts, max_len=32, seed=3)  # fixed positions, same number
    assert before["masked_tokens"] > 0 and before["perplexity"] > 100  # random weights: near the vocabulary size
    tok = AutoTokenizer.from_pretrained(str(enc))
    model = AutoModelForMaskedLM.from_pretrained(str(enc))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = tok(texts[:1], return_tensors="pt")
    for step in range(40):  # learn to fill any masked position of this one sentence
        g = torch.Generator().manual_seed(step)
        m = torch.rand(batch["input_ids"].shape, generator=g) < 0.3
        m[:, 0] = m[:, -1] = False
        labels = torch.where(m, batch["input_ids"], -100)
        inp = torch.where(m, tok.mask_token_id, batch["input_ids"])
        loss = model(input_ids=inp, attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(tmp_path / "trained")
    tok.save_pretrained(tmp_path / "trained")
    after = M.mlm_perplexity(tmp_path / "trained", texts, max_len=32, seed=3)
    assert after["masked_tokens"] == before["masked_tokens"]
    assert after["perplexity"] < before["perplexity"] / 10
    assert math.isclose(after["perplexity"], math.exp(after["loss"]), rel_tol=1e-9)
