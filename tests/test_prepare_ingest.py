"""Ingest of every source format, directories and globs, and the malformed-record policy."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.prepare.ingest import Ingest
from bertpipe.stages.prepare.params import LAWS_QUERY, SourceParams

DATA = Path(__file__).parent / "data" / "prepare"
REVIEWS = [x for x in (DATA / "neg_small.txt").read_text(encoding="utf-8").split("\n") if x.strip()][:20]


def read(*sources: SourceParams, max_docs: int = 0) -> tuple[list[dict], Ingest]:
    ing = Ingest(Path)
    return list(ing.documents(list(sources), "domain", max_docs)), ing


def test_jsonl_csv_parquet_give_the_same_documents(tmp_path):
    rows = [{"body": t, "doc": f"r{i}", "topic": "书" if i % 2 else "电脑", "n": i} for i, t in enumerate(REVIEWS)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", "utf-8")
    with open(tmp_path / "a.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet")
    got = {}
    for suffix in ("jsonl", "csv", "parquet"):
        src = SourceParams(
            path=str(tmp_path / f"a.{suffix}"), text_field="body", id_field="doc", group_field="topic",
            meta_fields=["n"], name="reviews",
        )
        docs, _ = read(src)
        got[suffix] = [(d["id"], d["text"], d["group"], d["n"]) for d in docs]
    assert got["jsonl"] == got["csv"] == got["parquet"]
    assert got["csv"][3] == ("reviews:r3", REVIEWS[3], "书", "3")


def test_sqlite_query_and_where():
    src = SourceParams(
        path=str(DATA / "laws_small.db"), format="sqlite", query=LAWS_QUERY, id_field="id", group_field="law_name",
        meta_fields=["publish_date", "status", "law_department"], name="law",
    )
    docs, _ = read(src)
    con = sqlite3.connect(DATA / "laws_small.db")
    assert len(docs) == con.execute("SELECT count(*) FROM articles").fetchone()[0]
    old, _ = read(src.model_copy(update={"where": "publish_date < '2020-01-01'"}))
    assert 0 < len(old) < len(docs)
    assert all(d["publish_date"] < "2020-01-01" for d in old)
    assert {d["group"] for d in docs} >= {"中华人民共和国商标法", "中华人民共和国仲裁法"}


@pytest.mark.parametrize(
    "src, error",
    [
        (dict(query="SELECT nope FROM articles"), r"laws_small\.db: the sqlite query failed \(no such column: nope\)"),
        (dict(query="SELECT article_text AS body FROM articles"), r"laws_small\.db: no column 'text'"),
        (dict(query=LAWS_QUERY, where="bogus >"), r"the sqlite query failed"),
    ],
)
def test_sqlite_errors(src, error):
    with pytest.raises(BertpipeError, match=error):
        read(SourceParams(path=str(DATA / "laws_small.db"), format="sqlite", **src))


def test_directory_glob_and_blank_line_units(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("甲文档第一行\n甲文档第二行\n\n乙文档\n", encoding="utf-8")
    (d / "sub" / "b.txt").write_text("丙文档\n", encoding="utf-8")
    (d / "skip.md").write_text("不读\n", encoding="utf-8")
    docs, _ = read(SourceParams(path=str(d), glob="*.txt", txt_unit="blank_line"))
    assert [d_["text"] for d_ in docs] == ["甲文档第一行\n甲文档第二行", "乙文档", "丙文档"]
    assert [d_["id"] for d_ in docs] == ["a:1", "a:4", "sub/b:1"]
    docs, _ = read(SourceParams(path=str(tmp_path / "corpus" / "**" / "*.txt")))
    assert len(docs) == 4


def test_ids_are_unique_per_file_of_a_named_directory_or_glob(tmp_path):
    """A named directory or glob source (as examples/own_domain has) with several files: each file's records get ids
    of their own (the name and the file's path under the source); a source naming one file keeps ``name:line``."""
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("甲文档\n\n乙文档\n", encoding="utf-8")
    (d / "b.txt").write_text("丙文档\n", encoding="utf-8")
    (d / "sub" / "a.txt").write_text("丁文档\n", encoding="utf-8")
    docs, _ = read(SourceParams(path=str(d), glob="**/*.txt", name="t", group_field="_block"))
    assert [(x["id"], x["group"], x["source"]) for x in docs] == [
        ("t:a.txt:1", "t:a.txt:1", "t"), ("t:a.txt:3", "t:a.txt:3", "t"), ("t:b.txt:1", "t:b.txt:1", "t"),
        ("t:sub/a.txt:1", "t:sub/a.txt:1", "t")]
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        pq.write_table(pa.Table.from_pylist([{"text": f"{t}{i}"} for t in REVIEWS[:3]]), shards / f"part-{i}.parquet")
    docs, _ = read(SourceParams(path=str(shards / "*.parquet"), name="p"))
    assert [x["id"] for x in docs] == [f"p:part-{i}.parquet:{n}" for i in range(2) for n in (1, 2, 3)]
    docs, _ = read(SourceParams(path=str(d / "b.txt"), name="t"))
    assert [x["id"] for x in docs] == ["t:1"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@pytest.mark.parametrize("field, value, kind", [("text", ["a", "b"], "a list"), ("topic", {"k": 1}, "a mapping"),
                                                ("doc", ["x"], "a list")])
def test_a_list_or_mapping_field_is_refused_not_stringified(tmp_path, fmt, field, value, kind):
    """A field holding a list or a mapping has no text: its Python repr ("['a', 'b']") must not enter the corpus."""
    rows = [{"text": "好的评论内容", "doc": "r1", "topic": "书"}, {"text": "另一条评论", "doc": "r2", "topic": "书"}]
    rows[1][field] = value
    p = tmp_path / f"a.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist([rows[1]]), p)  # one row: a column holds one type
    src = SourceParams(path=str(p), id_field="doc", meta_fields=["topic"])
    line = 2 if fmt == "jsonl" else 1
    want = (rf"a\.{fmt}:{line}: expected a JSON object with a string field 'text'" if fmt == "jsonl" and field == "text"
            else rf"a\.{fmt}:{line}: field '{field}' holds {kind}; expected a string or a number")
    with pytest.raises(BertpipeError, match=want):
        read(src)
    docs, ing = read(src.model_copy(update={"on_bad_record": "skip"}))
    assert ing.counts["bad_records"] == 1
    assert [d["id"] for d in docs] == (["a:r1"] if fmt == "jsonl" else [])


def test_numbers_stay_allowed_as_fields(tmp_path):
    p = tmp_path / "n.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "一条评论内容", "doc": 7, "score": 4.5}]), p)
    docs, _ = read(SourceParams(path=str(p), id_field="doc", meta_fields=["score"], name="n"))
    assert [(d["id"], d["score"]) for d in docs] == [("n:7", "4.5")]


def test_max_docs_is_shared_by_sources():
    srcs = [SourceParams(path=str(DATA / f"{n}_small.txt")) for n in ("pos", "neg")]
    docs, _ = read(*srcs, max_docs=11)
    assert [sum(d["source"] == s for d in docs) for s in ("pos_small", "neg_small")] == [6, 5]


def test_malformed_jsonl_fails_or_skips(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "好的评论内容"}\n{"text": 3}\n{broken\n\n{"text": "另一条评论"}\n', encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"bad\.jsonl:2: expected a JSON object with a string field 'text'"):
        read(SourceParams(path=str(p)))
    docs, ing = read(SourceParams(path=str(p), on_bad_record="skip"))
    assert [d["text"] for d in docs] == ["好的评论内容", "另一条评论"]
    assert ing.counts["bad_records"] == 2


def test_malformed_csv_row(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("text,label\n好评,1\n坏行,1,多余\n另一条,0\n", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"bad\.csv:3: expected 2 comma-separated fields"):
        read(SourceParams(path=str(p)))


def test_unknown_suffix_and_missing_path(tmp_path):
    (tmp_path / "x.weird").write_text("文本", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"x\.weird: cannot tell the format"):
        read(SourceParams(path=str(tmp_path / "x.weird")))
    with pytest.raises(BertpipeError, match=r"prepare\.domain\.sources\[0\]\.path: .*nope\.txt does not exist"):
        read(SourceParams(path=str(tmp_path / "nope.txt")))
    with pytest.raises(BertpipeError, match=r"no file matches"):
        read(SourceParams(path=str(tmp_path / "*.none")))


def test_not_a_parquet_file(tmp_path):
    p = tmp_path / "fake.parquet"
    p.write_text("不是parquet", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"fake\.parquet: expected a Parquet file"):
        read(SourceParams(path=str(p)))


def test_txt_block_groups(tmp_path):
    p = tmp_path / "pd.txt"
    p.write_text("甲/n  一/m\n甲/n  二/m\n\n乙/n  一/m\n", encoding="utf-8")
    docs, _ = read(SourceParams(path=str(p), strip_pos_tags=True, group_field="_block", name="pd"))
    assert [(d["text"], d["group"]) for d in docs] == [("甲一", "pd:1"), ("甲二", "pd:1"), ("乙一", "pd:4")]


def test_txt_has_no_named_fields(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("一行文本\n", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"a\.txt: a txt source has no field 'law_name'"):
        read(SourceParams(path=str(p), group_field="law_name"))
