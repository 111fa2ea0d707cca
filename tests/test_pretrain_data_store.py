"""The token store holds exactly the in-memory builder's examples (tokenized in worker processes, from sharded
parquet), is built once per key and reused by runs that differ only in training params."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from bertpipe.lib import keyedstore
from bertpipe.lib.corpusio import read_texts
from bertpipe.lib.mlm.data import build_examples, collate
from bertpipe.lib.mlm.params import PretrainParams
from bertpipe.stages.pretrain import tokstore
from tests.test_pretrain_support import law_texts

QUIET = {"log": lambda m: None}


@pytest.fixture(scope="module")
def tok(zh_tokenizer_dir):
    return AutoTokenizer.from_pretrained(zh_tokenizer_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_raw):
    """1,100 documents (three packing chunks, so NSP partners cross chunks) in two uneven shards, with blank rows."""
    root = tmp_path_factory.mktemp("corpus")
    texts = law_texts(sample_raw, 1100)
    (root / "train").mkdir()
    for i, part in enumerate((texts[:600] + ["", "  "], texts[600:])):
        pq.write_table(pa.table({"text": part}), root / "train" / f"part-{i:05d}.parquet", row_group_size=97)
    pq.write_table(pa.table({"text": law_texts(sample_raw, 50, 2000)}), root / "valid.parquet")
    return root


def _same(store, expected) -> None:
    assert len(store) == len(expected) > 0
    for e, x in zip(store, expected):
        assert np.array_equal(e.ids, x.ids) and np.array_equal(e.words, x.words)
        assert (e.n_first, e.pair_label) == (x.n_first, x.pair_label)
    assert np.array_equal(store.lengths, [len(x) for x in expected])


@pytest.mark.parametrize("params,limit,workers", [
    ({"max_seq_len": 64}, 0, 1),
    ({"max_seq_len": 128, "cross_document": False}, 0, 1),
    ({"max_seq_len": 48, "pair_objective": "nsp"}, 0, 2),
    ({"max_seq_len": 96, "pair_objective": "sop"}, 600, 2),
])
def test_store_equals_in_memory_builder(tmp_path, tok, corpus, params, limit, workers):
    p = PretrainParams(**params)
    store, rec = tokstore.open_or_build(corpus, "train", tok, "zh", p, limit, 11, tmp_path, workers=workers, **QUIET)
    expected = build_examples(read_texts(corpus, "train"), tok, "zh", p, limit, 11)
    _same(store, expected)
    assert rec["built"] and rec["examples"] == len(expected) and rec["tokens"] == sum(len(x) for x in expected)
    assert (tmp_path / "tokstore" / rec["key"] / "meta.json").is_file()
    assert not list((tmp_path / "tokstore").glob("*.tmp-*"))
    a, b = collate(store[5:9], tok.pad_token_id), collate(expected[5:9], tok.pad_token_id)
    assert all(a[k].equal(b[k]) for k in a)


def test_store_is_reused_across_training_params_and_rebuilt_for_packing(tmp_path, tok, corpus):
    base = PretrainParams(max_seq_len=64)
    _, first = tokstore.open_or_build(corpus, "valid", tok, "zh", base, 0, 1, tmp_path, workers=1, **QUIET)
    # training-only params, RTD, another seed without a pair objective: the same examples, the same store
    for other, seed in ((dict(max_steps=7, lr=3e-3, masking="static", batch_size=4), 1), (dict(objective="rtd"), 9)):
        _, rec = tokstore.open_or_build(corpus, "valid", tok, "zh", base.model_copy(update=other), 0, seed, tmp_path,
                                        workers=1, **QUIET)
        assert rec["key"] == first["key"] and not rec["built"]
    # what changes the examples changes the key
    for other in (dict(max_seq_len=32), dict(pair_objective="sop")):
        _, rec = tokstore.open_or_build(corpus, "valid", tok, "zh", base.model_copy(update=other), 0, 1, tmp_path,
                                        workers=1, **QUIET)
        assert rec["key"] != first["key"] and rec["built"]
    _, rec = tokstore.open_or_build(corpus, "valid", tok, "zh", base, 10, 1, tmp_path, workers=1, **QUIET)
    assert rec["key"] != first["key"] and rec["examples"] == 10


def test_concurrent_builders_build_once_and_a_killed_build_is_cleared(tmp_path, tok, corpus):
    p = PretrainParams(max_seq_len=64)
    key = keyedstore.store_key(tokstore.key_parts(corpus, "valid", tok, "zh", p, 0, 1))
    (tmp_path / "tokstore" / f"{key}.tmp-deadbeef").mkdir(parents=True)  # what a SIGKILL mid-build leaves
    records = []

    def open_it():
        records.append(tokstore.open_or_build(corpus, "valid", tok, "zh", p, 0, 1, tmp_path, workers=1, **QUIET)[1])

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r["built"] for r in records) == [False, False, True]
    assert {r["key"] for r in records} == {key}
    assert sorted(x.name for x in (tmp_path / "tokstore").iterdir()) == [key, f"{key}.lock"]


def test_a_damaged_store_is_one_line_error(tmp_path, tok, corpus):
    from bertpipe.infra.errors import BertpipeError

    p = PretrainParams(max_seq_len=64)
    store, rec = tokstore.open_or_build(corpus, "valid", tok, "zh", p, 0, 1, tmp_path, workers=1, **QUIET)
    ids = store.path / "ids.bin"
    ids.write_bytes(ids.read_bytes()[:-8])  # two tokens short, as a disk error would leave it
    with pytest.raises(BertpipeError) as e:
        tokstore.open_or_build(corpus, "valid", tok, "zh", p, 0, 1, tmp_path, workers=1, **QUIET)
    assert str(e.value).startswith(f"{store.path}: token store files ['ids']") and "\n" not in str(e.value)


def test_a_store_whose_content_changed_is_one_line_error(tmp_path, tok, corpus):
    """ids rewritten out of the vocabulary, the size kept: opening the store says so (training would fail steps
    later on an embedding lookup); a store copied elsewhere with its content intact still opens."""
    import os
    import shutil

    from bertpipe.infra.errors import BertpipeError

    p = PretrainParams(max_seq_len=64)
    store, rec = tokstore.open_or_build(corpus, "valid", tok, "zh", p, 0, 1, tmp_path, workers=1, **QUIET)
    copy = tmp_path / "copy"
    shutil.copytree(store.path, copy)  # new inodes: the content is hashed again and matches
    assert len(tokstore.ExampleStore(copy)) == len(store)
    ids = store.path / "ids.bin"
    st = ids.stat()
    bad = np.full(len(store.ids), len(tok) + 5, np.int32)
    with open(ids, "r+b") as f:
        f.write(bad.tobytes())
    os.utime(ids, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ids.stat().st_size == st.st_size
    with pytest.raises(BertpipeError) as e:
        tokstore.open_or_build(corpus, "valid", tok, "zh", p, 0, 1, tmp_path, workers=1, **QUIET)
    msg = str(e.value)
    assert msg.startswith(f"{store.path}: token store files ['ids.bin'] differ from what was built") and "\n" not in msg
    assert "delete the directory and rerun to rebuild it" in msg
