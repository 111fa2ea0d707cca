"""Example construction: packing keeps all text, NSP/SOP pairs are what they claim, buckets cut padding."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from bertpipe.lib.mlm.data import _sentences, build_examples, collate, epoch_batches
from bertpipe.lib.mlm.params import PretrainParams
from tests.test_pretrain_support import law_texts


@pytest.fixture(scope="module")
def tok(zh_tokenizer_dir):
    return AutoTokenizer.from_pretrained(zh_tokenizer_dir)


@pytest.fixture(scope="module")
def docs(sample_raw):
    return law_texts(sample_raw, 300)


def _body(e, tok):
    keep = ~np.isin(e.ids, [tok.cls_token_id, tok.sep_token_id])
    return e.ids[keep]


@pytest.mark.parametrize("cross_document", [True, False])
@pytest.mark.parametrize("max_seq_len", [32, 128])
def test_packing_keeps_every_token_in_order(tok, docs, cross_document, max_seq_len):
    p = PretrainParams(max_seq_len=max_seq_len, cross_document=cross_document)
    ex = build_examples(docs, tok, "zh", p)
    stream = np.concatenate([s[0] for d in _sentences(docs, tok, "zh") for s in d])
    packed = np.concatenate([_body(e, tok) for e in ex])
    assert np.array_equal(packed, stream)
    lens = np.array([len(e) for e in ex])
    assert lens.max() <= max_seq_len
    assert all((e.n_first == len(e)) and e.pair_label == -100 for e in ex)
    if cross_document:  # segments are filled across documents, so few are short
        assert np.median(lens) >= 0.75 * max_seq_len


def _find(hay: np.ndarray, needle: np.ndarray) -> int:
    for i in range(len(hay) - len(needle) + 1):
        if hay[i] == needle[0] and np.array_equal(hay[i : i + len(needle)], needle):
            return i
    return -1


@pytest.mark.parametrize("max_seq_len", [48, 128])
def test_nsp_pairs(tok, docs, max_seq_len):
    p = PretrainParams(max_seq_len=max_seq_len, pair_objective="nsp")
    ex = build_examples(docs, tok, "zh", p, seed=3)
    doc_ids = [np.concatenate([s[0] for s in d]) for d in _sentences(docs, tok, "zh")]
    labels = np.array([e.pair_label for e in ex])
    assert set(labels) == {0, 1}
    assert 0.4 < labels.mean() < 0.6, labels.mean()  # 50% IsNext / 50% NotNext
    checked = {0: 0, 1: 0}
    for e in ex[:150]:
        assert len(e) <= max_seq_len
        seps = np.flatnonzero(e.ids == tok.sep_token_id)
        assert e.ids[0] == tok.cls_token_id and len(seps) == 2 and seps[0] == e.n_first - 1
        types = collate([e], tok.pad_token_id)["token_type_ids"][0].numpy()
        assert (types[: e.n_first] == 0).all() and (types[e.n_first :] == 1).all()
        a, b = e.ids[1 : seps[0]], e.ids[seps[0] + 1 : seps[1]]
        home = [i for i, d in enumerate(doc_ids) if _find(d, a) >= 0]
        assert home, "segment A must be contiguous text of one document"
        follows = any(_find(doc_ids[i], np.concatenate([a, b])) >= 0 for i in home)
        if e.pair_label == 0:
            assert follows, "IsNext: B continues A in the same document"
        elif len(b) > 3:
            assert not follows, "NotNext: B is not A's continuation"
        checked[e.pair_label] += 1
    assert min(checked.values()) > 20


def test_sop_pairs_are_swapped_continuations(tok, docs):
    p = PretrainParams(max_seq_len=96, pair_objective="sop")
    ex = build_examples(docs, tok, "zh", p, seed=5)
    doc_ids = [np.concatenate([s[0] for s in d]) for d in _sentences(docs, tok, "zh")]
    labels = np.array([e.pair_label for e in ex])
    assert 0.4 < labels.mean() < 0.6
    for e in ex[:100]:
        seps = np.flatnonzero(e.ids == tok.sep_token_id)
        a, b = e.ids[1 : seps[0]], e.ids[seps[0] + 1 : seps[1]]
        first, second = (b, a) if e.pair_label == 1 else (a, b)
        assert any(_find(d, np.concatenate([first, second])) >= 0 for d in doc_ids)


def test_buckets_are_deterministic_and_cut_padding(tok, docs):
    p = PretrainParams(max_seq_len=128, cross_document=False)
    lengths = np.array([len(e) for e in build_examples(docs, tok, "zh", p)])

    def pad_share(bucket):
        bs = epoch_batches(lengths, 16, 0, 0, bucket)
        cells = sum(len(b) * lengths[b].max() for b in bs)
        return 1 - sum(lengths[b].sum() for b in bs) / cells

    assert pad_share(True) < 0.5 * pad_share(False)
    a = epoch_batches(lengths, 16, 0, 1, True)
    b = epoch_batches(lengths, 16, 0, 1, True)
    c = epoch_batches(lengths, 16, 0, 2, True)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    assert len(np.unique(np.concatenate(a))) == len(np.concatenate(a))  # no example twice in an epoch
