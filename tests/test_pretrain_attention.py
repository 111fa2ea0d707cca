"""Packed pretraining rows: each document attends only to itself, on every encoder family, and a row holding one
document runs exactly as under the plain padding mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertpipe.infra.attention import document_ids, document_mask
from bertpipe.lib.mlm.data import Example, build_examples, collate
from bertpipe.lib.mlm.masking import IGNORE
from bertpipe.lib.mlm.model import PretrainModel, load_checkpoint
from bertpipe.lib.mlm.params import PretrainParams
from bertpipe.lib.mlm.train import Dist, evaluate
from tests.families import FAMILIES, family_dirs  # noqa: F401 (a fixture)
from tests.test_pretrain_support import law_texts


def _words(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def test_document_ids_cut_after_each_interior_separator():
    # [CLS] a a [SEP] b b b [SEP] c [SEP]: the separators close their documents
    words = np.array([-1, 0, 1, -1, 2, 3, 4, -1, 5, -1])
    assert document_ids(words, 10, 10).tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    # a pair example ([CLS] A [SEP] B [SEP]) is one document
    assert document_ids(words, 10, 4).tolist() == [1] * 10


def test_collate_numbers_the_packed_documents(zh_tokenizer_dir, sample_raw):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    docs = law_texts(sample_raw, 60)
    ex = build_examples(docs, tok, "zh", PretrainParams(max_seq_len=128, cross_document=True))
    b = collate(ex[:16], tok.pad_token_id)
    assert "doc_ids" in b  # law articles are short: rows pack several
    d, ids, am = b["doc_ids"], b["input_ids"], b["attention_mask"]
    assert torch.equal(d > 0, am.bool())
    for r in range(len(d)):
        n = int(am[r].sum())
        interior = (ids[r, 1 : n - 1] == tok.sep_token_id).nonzero().flatten() + 1
        assert int(d[r, :n].max()) == len(interior) + 1
        for pos in interior.tolist():  # a new document starts right after each separator
            assert d[r, pos + 1] == d[r, pos] + 1
    # one document per row (no cross-document packing): plain padding mask, no doc_ids
    single = build_examples(docs, tok, "zh", PretrainParams(max_seq_len=128, cross_document=False))
    assert "doc_ids" not in collate(single[:16], tok.pad_token_id)


def _packed_batch(tok, a: list[int], b: list[int], cls: int, sep: int) -> dict:
    """One row packing document A and document B ([CLS] A [SEP] B [SEP]) plus a shorter row, labels on A only."""
    ids = np.array([cls, *a, sep, *b, sep], np.int32)
    words = np.concatenate([[-1], _words(len(a)), [-1], _words(len(b), len(a)), [-1]]).astype(np.int32)
    row2 = Example(np.array([cls, *a[:4], sep], np.int32), np.concatenate([[-1], _words(4), [-1]]).astype(np.int32), 6)
    batch = collate([Example(ids, words, len(ids)), row2], tok.pad_token_id)
    labels = torch.full_like(batch["input_ids"], IGNORE)
    labels[0, 2:5] = batch["input_ids"][0, 2:5]  # three tokens of A
    labels[1, 2] = batch["input_ids"][1, 2]
    batch["input_ids"][0, 2:5] = tok.mask_token_id
    batch["labels"] = labels
    return batch


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_document_gets_no_attention_from_another(family, family_dirs):  # noqa: F811
    mlm, tok, _ = load_checkpoint(family_dirs[family], log=lambda *_: None)
    torch.manual_seed(0)
    pm = PretrainModel(mlm, pair=False).eval()
    normal = [i for i in range(len(tok)) if i not in set(tok.all_special_ids)][50:90]
    a, b1, b2 = normal[:8], normal[8:20], normal[20:32]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    losses = [evaluate(pm, [_packed_batch(tok, a, b, cls, sep)], Dist())["eval_loss"] for b in (b1, b2)]
    # document B's tokens changed, document A's masked-token loss did not: A never attended to B
    assert np.isfinite(losses[0]) and losses[0] == pytest.approx(losses[1], abs=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_document_rows_agree_with_the_padding_mask(family, family_dirs):  # noqa: F811
    mlm, tok, _ = load_checkpoint(family_dirs[family], log=lambda *_: None)
    impls = ["sdpa", "eager"] if family == "bert" else [mlm.config._attn_implementation]
    for impl in impls:
        mlm.set_attn_implementation(impl)
        pm = PretrainModel(mlm, pair=False).eval()
        texts = ["根据法律规定，当事人应当履行合同。", "the court"]
        enc = tok(texts, padding=True, return_tensors="pt")
        am = enc["attention_mask"]
        assert am.sum() < am.numel()  # the second row is padded
        tt = torch.zeros_like(enc["input_ids"])
        labels = torch.where(am.bool(), enc["input_ids"], torch.full_like(am, IGNORE))  # every real token scored
        with torch.no_grad():
            padded = pm(enc["input_ids"], am, tt, labels)
            confined = pm(enc["input_ids"], am, tt, labels, doc_ids=am.clone())
        assert confined["mlm_sum"] == pytest.approx(float(padded["mlm_sum"]), rel=1e-5), impl
        # the same document alone, without padding, agrees as well
        n = int(am[1].sum())
        with torch.no_grad():
            alone = pm(enc["input_ids"][1:, :n], am[1:, :n], tt[1:, :n], labels[1:, :n])
            row = pm(enc["input_ids"][1:], am[1:], tt[1:], labels[1:], doc_ids=am[1:].clone())
        assert float(row["mlm_sum"]) == pytest.approx(float(alone["mlm_sum"]), rel=1e-4), impl


def test_eager_attention_gets_an_additive_mask():
    doc = torch.tensor([[1, 1, 2, 0]])
    bool_mask = document_mask(doc, "sdpa")
    add = document_mask(doc, "eager")
    assert bool_mask.dtype == torch.bool and add.dtype == torch.float32
    assert torch.equal(add == 0, bool_mask)
    assert bool_mask[0, 0].tolist() == [[True, True, False, False], [True, True, False, False],
                                        [False, False, True, False], [True, True, True, False]]
