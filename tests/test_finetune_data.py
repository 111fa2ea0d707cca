"""Task data: readers, bad input reported with file:line, cleaning, deterministic leak-free splits, label sets."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.training import taskfiles as D
from bertpipe.lib.training.params import TaskParams
from bertpipe.stages.finetune.params import default_tasks

FIX = Path(__file__).parent / "data" / "finetune"


def _split(p: TaskParams, resolve) -> tuple[dict, Counter]:
    """Read, clean and split a task by its own groups: the splits stage's steps before near-duplicate handling."""
    counts: Counter = Counter()
    return D.split_missing(D.read_files(p, resolve, counts), p, counts), counts


def _load(p: TaskParams, root: Path) -> tuple[dict, Counter]:
    return _split(p, lambda s: root / s)


def _write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def test_msra_style_conll_with_crlf(tmp_path):
    p = TaskParams(type="ner", format="conll", train="msra_tiny.txt", tag_scheme="BMES", conll_columns=2,
                   dev_ratio=0.0, test_ratio=0.0)
    data, counts = _load(p, FIX)
    exs = data["train"]
    assert [e.text for e in exs] == ["中国银行在北京", "张三说", "王五去沪"]
    assert [[e.text[a:b] for a, b, _ in e.spans] for e in exs] == [["中国银行", "北京"], ["张三"], ["王五", "沪"]]
    # 王/B 五/M 去/O: an entity never closed by E-, as a few in the real MSRA file; repaired and counted
    assert counts["tags_repaired"] == 1 and all(len(e.units) == len(e.text) for e in exs)


def test_conll_wrong_column_count_names_file_and_line():
    p = TaskParams(type="ner", format="conll", train="bad_columns.conll")
    with pytest.raises(BertpipeError, match=r"bad_columns\.conll:2: expected 2 whitespace-separated columns, got 3"):
        _load(p, FIX)


@pytest.mark.parametrize("mode", ["repair", "error"])
def test_invalid_bio_sequence_repaired_and_counted_or_error(tmp_path, mode):
    _write(tmp_path / "t.conll", "甲 O\n乙 I-PER\n丙 I-PER\n\n丁 B-LOC\n\n", "\r\n")
    p = TaskParams(type="ner", format="conll", train="t.conll", invalid_tags=mode, dev_ratio=0, test_ratio=0)
    if mode == "error":
        with pytest.raises(BertpipeError, match=r"t\.conll:2: invalid BIO sequence"):
            _load(p, tmp_path)
        return
    data, counts = _load(p, tmp_path)
    assert counts["tags_repaired"] == 1 and data["train"][0].spans == [(1, 3, "PER")]


@pytest.mark.parametrize("mode", ["error", "map"])
def test_label_unseen_in_train(tmp_path, mode):
    D_ = tmp_path
    _write(D_ / "train.jsonl", "\n".join(json.dumps({"text": f"文本{i}", "label": "ab"[i % 2]}) for i in range(6)))
    _write(D_ / "test.jsonl", json.dumps({"text": "新的", "label": "a"}) + "\n" + json.dumps({"text": "x", "label": "zz"}))
    p = TaskParams(type="classification", format="jsonl", train="train.jsonl", test="test.jsonl",
                   unknown_label=mode, dev_ratio=0.2)
    data, counts = _load(p, D_)
    if mode == "error":
        with pytest.raises(BertpipeError, match=r"test\.jsonl:2: label 'zz' does not occur in train"):
            D.label_list(p, data, counts)
        return
    labels = D.label_list(p, data, counts)
    assert labels == ["a", "b", "<unk>"] and data["test"][1].label == "<unk>" and counts["test_unknown_labels"] == 1


@pytest.mark.parametrize("text, kept", [("", False), ("   ", False), ("😀", True), ("ＡＢＣ", True), ("mixed中文", True)])
def test_empty_texts_are_dropped_and_counted(tmp_path, text, kept):
    rows = [{"text": text, "label": "a"}] + [{"text": f"好{i}", "label": "ab"[i % 2]} for i in range(4)]
    _write(tmp_path / "t.csv", "text,label\n" + "\n".join(f"{r['text']},{r['label']}" for r in rows))
    p = TaskParams(type="classification", format="csv", train="t.csv", dev_ratio=0, test_ratio=0)
    data, counts = _load(p, tmp_path)
    assert (text in [e.text for e in data["train"]]) == kept
    assert counts["train_empty_dropped"] == (0 if kept else 1)


def test_jsonl_bad_line_and_missing_field(tmp_path):
    _write(tmp_path / "a.jsonl", '{"text": "a", "label": "x"}\n{broken\n')
    p = TaskParams(type="classification", format="jsonl", train="a.jsonl")
    with pytest.raises(BertpipeError, match=r"a\.jsonl:2: expected one JSON object per line"):
        _load(p, tmp_path)
    _write(tmp_path / "b.jsonl", '{"text": "a", "label": "x"}\n{"txt": "b", "label": "y"}\n')
    p = TaskParams(type="classification", format="jsonl", train="b.jsonl")
    with pytest.raises(BertpipeError, match=r"b\.jsonl:2: missing field 'text'"):
        _load(p, tmp_path)


@pytest.mark.parametrize("rec, error", [
    ({"text": ["a", "b"], "label": "pos"}, r"a\.jsonl:2: field 'text' holds a list; expected a string"),
    ({"text": "好评", "label": ["pos"]}, r"a\.jsonl:2: field 'label' holds a list; expected a string"),
    ({"text": "好评", "label": {"name": "pos"}}, r"a\.jsonl:2: field 'label' holds a mapping; expected a string"),
    ({"text": "好评", "label": "pos", "id": [1]}, r"a\.jsonl:2: field 'id' holds a list; expected a string"),
])
def test_a_list_or_mapping_is_no_text_or_label(tmp_path, rec, error):
    """Its Python repr would become the text ("['a', 'b']") or a class ("['pos']")."""
    _write(tmp_path / "a.jsonl", json.dumps({"text": "差评", "label": "neg"}) + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(BertpipeError, match=error):
        _load(TaskParams(type="classification", format="jsonl", train="a.jsonl", dev_ratio=0, test_ratio=0), tmp_path)


def test_numbers_stay_allowed_as_labels_and_texts(tmp_path):
    _write(tmp_path / "a.jsonl", "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in
                                         [("好评", 1), (2024, 0), ("差评", 0)]))
    data, _ = _load(TaskParams(type="classification", format="jsonl", train="a.jsonl", dev_ratio=0, test_ratio=0),
                    tmp_path)
    assert [(e.text, e.label) for e in data["train"]] == [("好评", "1"), ("2024", "0"), ("差评", "0")]


def _cls(train: str) -> TaskParams:
    return TaskParams(type="classification", format=train.rsplit(".", 1)[1], train=train, dev_ratio=0, test_ratio=0)


@pytest.mark.parametrize("name, content, error", [
    # an empty, blank or NaN label would be a class of its own
    ("a.csv", "text,label\n好评,pos\n差评,\n", r"a\.csv:3: field 'label' is empty"),
    ("a.csv", "text,label\n好评,pos\n差评, \n", r"a\.csv:3: field 'label' is empty"),
    ("a.jsonl", '{"text": "好评", "label": "pos"}\n{"text": "差评", "label": ""}\n', r"a\.jsonl:2: field 'label' is empty"),
    ("a.jsonl", '{"text": "好评", "label": "pos"}\n{"text": "差评", "label": NaN}\n', r"a\.jsonl:2: field 'label' is nan"),
    # one number spelled two ways would be two classes
    ("a.jsonl", '{"text": "好", "label": 1}\n{"text": "差", "label": "1.0"}\n',
     r"a\.jsonl:2: label '1\.0' is the number of label '1' \(.*a\.jsonl:1\)"),
    ("a.csv", "text,label\n好,01\n差,2\n中,1\n", r"a\.csv:4: label '1' is the number of label '01'"),
])
def test_a_label_that_is_no_class_of_its_own_is_an_error(tmp_path, name, content, error):
    _write(tmp_path / name, content)
    with pytest.raises(BertpipeError, match=error):
        _load(_cls(name), tmp_path)


def test_a_number_is_one_class_whatever_its_json_type(tmp_path):
    rows = [(1, "好"), ("1", "好评"), (1.0, "很好"), (2, "差"), ("2", "差评"), (2.0, "很差"), (0.50, "中"),
            (True, "是"), ("true", "是的")]
    _write(tmp_path / "a.jsonl", "".join(json.dumps({"text": t, "label": y}) + "\n" for y, t in rows))
    data, counts = _load(_cls("a.jsonl"), tmp_path)
    assert [e.label for e in data["train"]] == ["1", "1", "1", "2", "2", "2", "0.5", "true", "true"]
    assert D.label_list(_cls("a.jsonl"), data, counts) == ["0.5", "1", "2", "true"]


def test_a_repeated_id_is_an_error_naming_both_rows(tmp_path):
    _write(tmp_path / "a.jsonl", "".join(json.dumps({"id": 7, "text": f"第{i}条", "label": "ab"[i % 2]}) + "\n"
                                         for i in range(90)))
    with pytest.raises(BertpipeError, match=r"a\.jsonl:2: id '7' repeats the id of .*a\.jsonl:1; give every example "
                                            r"its own id"):
        _load(_cls("a.jsonl"), tmp_path)
    # ids are per file: the same id in train and in test is two examples
    _write(tmp_path / "b.jsonl", json.dumps({"id": 1, "text": "差评", "label": "b"}) + "\n")
    _write(tmp_path / "a.jsonl", "".join(json.dumps({"id": i, "text": f"第{i}条", "label": "ab"[i % 2]}) + "\n"
                                         for i in range(4)))
    data, _ = _load(TaskParams(type="classification", format="jsonl", train="a.jsonl", test="b.jsonl",
                               dev_ratio=0), tmp_path)
    assert len(data["train"]) == 4 and len(data["test"]) == 1


def test_overlapping_ner_spans_are_an_error_naming_both(tmp_path):
    """Each character takes one tag: the later span overwrote the earlier one's. A repeated span is kept once."""
    spans = [{"start": 3, "end": 6, "label": "LOC"}, {"start": 4, "end": 6, "label": "ORG"}]
    _write(tmp_path / "n.jsonl", json.dumps({"text": "张三去北京市了", "spans": spans[:1] * 2}, ensure_ascii=False)
           + "\n" + json.dumps({"text": "张三去北京市了", "spans": spans}, ensure_ascii=False) + "\n")
    p = TaskParams(type="ner", format="jsonl", train="n.jsonl", dev_ratio=0, test_ratio=0)
    with pytest.raises(BertpipeError, match=r"n\.jsonl:2: spans \[3, 6, LOC\] and \[4, 6, ORG\] overlap"):
        _load(p, tmp_path)
    _write(tmp_path / "n.jsonl", json.dumps({"text": "张三去北京市了", "spans": spans[:1] * 2}, ensure_ascii=False))
    data, _ = _load(p, tmp_path)
    assert data["train"][0].spans == [(3, 6, "LOC")]


def test_tsv_pair_classification_fields(tmp_path):
    rows = "\n".join(f"{i}\t问{i}\t答{i}\t{'yn'[i % 2]}" for i in range(10))
    _write(tmp_path / "p.tsv", "qid\tq\ta\ty\n" + rows)
    p = TaskParams(type="pair_classification", format="tsv", train="p.tsv", id_field="qid", text_field="q",
                   text_pair_field="a", label_field="y", dev_ratio=0, test_ratio=0)
    data, _ = _load(p, tmp_path)
    ex = data["train"][3]
    assert (ex.text, ex.text_pair, ex.label, ex.where.endswith("p.tsv:5")) == ("问3", "答3", "n", True)


def test_lines_dedup_and_conflicting_lines(tmp_path):
    _write(tmp_path / "pos.txt", "好书\n好书\n一般\n很好\n")
    _write(tmp_path / "neg.txt", "一般\n太差\n太差\n差\n")
    p = TaskParams(type="classification", format="lines", label_files={"pos": "pos.txt", "neg": "neg.txt"},
                   dedup=True, drop_conflicts=True, dev_ratio=0, test_ratio=0, min_chars=1)
    data, counts = _load(p, tmp_path)
    assert {(e.text, e.label) for e in data["train"]} == {("太差", "neg"), ("差", "neg"), ("好书", "pos"), ("很好", "pos")}
    assert len(data["train"]) == 4
    assert counts["train_conflicts_dropped"] == 2 and counts["train_duplicates_dropped"] == 2


def test_group_split_is_deterministic_stratified_and_leak_free():
    exs = [D.Example(id=str(i), text=f"t{i}", label="abc"[g % 3], group=f"g{g}") for g in range(60) for i in
           range(g * 10, g * 10 + 1 + g % 4)]
    a = D.group_split(exs, 0.1, 0.2, seed=1)
    b = D.group_split(list(reversed(exs)), 0.1, 0.2, seed=1)
    groups = {s: {e.group for e in a[s]} for s in D.SPLITS}
    assert not (groups["train"] & groups["dev"]) and not (groups["train"] & groups["test"])
    assert not (groups["dev"] & groups["test"])
    assert {s: groups[s] for s in D.SPLITS} == {s: {e.group for e in b[s]} for s in D.SPLITS}
    assert all({e.label for e in a[s]} == set("abc") for s in D.SPLITS)  # every stratum reaches every split
    assert len(groups["test"]) == 12 and len(groups["dev"]) == 6
    assert D.group_split(exs, 0.1, 0.2, seed=2)["test"] != a["test"]


def test_cap_is_deterministic_and_keeps_order():
    exs = [D.Example(id=str(i), text=str(i)) for i in range(100)]
    got = D.cap(exs, 10, 3)
    assert got == D.cap(exs, 10, 3) and len(got) == 10 and got == sorted(got, key=lambda e: int(e.id))
    assert D.cap(exs, 0, 3) == exs


def test_squad_fixture_and_bad_answers(tmp_path):
    counts: Counter = Counter()
    exs = list(D.read_squad(FIX / "cmrc_tiny.json", counts))
    assert len(exs) == 4 and counts["answer_start_fixed"] == 0
    for ex in exs:
        assert all(ex.text[s : s + len(a)] == a for a, s in ex.answers)
    doc = json.loads((FIX / "cmrc_tiny.json").read_text(encoding="utf-8"))
    qa = doc["data"][0]["paragraphs"][0]["qas"][0]
    qa["answers"][0]["answer_start"] = 0  # wrong offset but the text occurs: fixed and counted
    _write(tmp_path / "off.json", json.dumps(doc, ensure_ascii=False))
    counts = Counter()
    assert list(D.read_squad(tmp_path / "off.json", counts))[0].answers[0][1] == 70
    assert counts["answer_start_fixed"] == 1
    qa["answers"][0]["text"] = "不存在的答案"
    _write(tmp_path / "bad.json", json.dumps(doc, ensure_ascii=False))
    with pytest.raises(BertpipeError, match=r"bad\.json: data\[0\]\.paragraphs\[0\]\.qas\[0\] .* is not in its context"):
        list(D.read_squad(tmp_path / "bad.json", Counter()))


def _sample_resolver(sample_raw: Path):
    return lambda s: sample_raw / s.replace("{raw}/", "")


def test_law_department_is_split_by_law(sample_raw):
    p = default_tasks()["law_department"]
    data, counts = _split(p, _sample_resolver(sample_raw))
    laws = {s: {e.group for e in data[s]} for s in D.SPLITS}
    assert laws["test"] and laws["dev"] and not (laws["train"] & laws["test"]) and not (laws["train"] & laws["dev"])
    labels = D.label_list(p, data, counts)
    assert len(labels) == 8 and {e.label for e in data["test"]} <= set(labels)
    assert sum(len(v) for v in data.values()) > 20000


def test_sentiment_sample_has_no_duplicates_or_conflicts(sample_raw):
    p = default_tasks()["sentiment"]
    data, counts = _split(p, _sample_resolver(sample_raw))
    texts = [e.text.strip() for s in D.SPLITS for e in data[s]]
    assert len(texts) == len(set(texts)) and counts["train_duplicates_dropped"] > 0
    assert D.label_list(p, data, counts) == ["neg", "pos"]


def test_msra_sample_test_file(sample_raw):
    p = default_tasks()["msra_ner"]
    counts: Counter = Counter()
    exs = list(D.read_conll(sample_raw / "msra" / "msra_test.txt", p, counts))
    assert len(exs) > 4000
    types = {t for e in exs for *_, t in e.spans}
    assert types == {"PER", "LOC", "ORG"}
    assert all(e.text[a:b] and "\r" not in e.text for e in exs[:500] for a, b, _ in e.spans)
