"""A catalogue of bad inputs, each run through the real `bertpipe` command in a temp project, in this process
(``e2e_project.invoke``: Typer's CliRunner on ``bertpipe.doors.cli.commands.app``, the case's cwd and environment).

For every case: non-zero exit, exactly one `error:` line that names the file/line/key (a regex per case), no
traceback, no new directory (temp or output) under work/, and every file of the case byte-identical afterwards.
Case dirs live under a path with a space, `#` and non-ASCII characters, so every case also exercises path quoting.
Add a case to CASES when a new bad input is found: that is the point of the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

from tests.e2e_project import FEW_LAWS, env_for, invoke, laws_source

GB = "第一条 为了保护公民的合法权益，制定本法。\n第二条 本法适用于全国。\n".encode("gb18030")


# A "billion laughs" of 9 levels x 9 aliases (~350 bytes; 9**9 values once expanded: 3 GB before the loader bounded it)
BOMB = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))).encode()


def _rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@dataclass
class Case:
    id: str
    argv: list[str]  # after `bertpipe`
    expect: str  # regex the one error line must match
    params: dict | bytes | None = None  # merged over the base params; bytes: the params file verbatim
    files: dict[str, bytes] = field(default_factory=dict)  # case-relative path -> content
    setup: Callable[[Path, "Shared"], None] | None = None
    slow: bool = False  # goes through a stage build (imports torch and MLflow: seconds, not a second)


@dataclass
class Shared:
    root: Path  # holds the case dirs: "bad inputs #1 ü/<case>"
    state: Path  # one MLflow store/hash cache for all cases (plain path)
    raw: Path
    encoder: Path
    tokenizer: Path


def laws_copy(case: Path, sh: Shared, transform: Callable[[bytes], bytes], raw: str = "raw") -> None:
    db = case / raw / "china_law" / "laws.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(transform((sh.raw / "china_law" / "laws.db").read_bytes()))


def txt_source(name: str, **extra) -> dict:
    return {"prepare": {"domain": {"sources": [{"path": name, "format": "txt", "name": "t", **extra}]}}}


def task(name: str, **spec) -> dict:
    return {"finetune": {"encoders": ["base"], "tasks": {name: spec}}}


CLS = {"type": "classification", "format": "jsonl", "train": "t.jsonl"}
NER = {"type": "ner", "format": "conll", "train": "t.txt", "tag_scheme": "BIO"}
CONLL = "中 B-LOC\n国 I-LOC\n人 O\n\n北 B-LOC\n京 I-LOC\n\n".encode()
FT = ["splits"]  # task data is read (and refused) where it is materialised, before any finetune


def immutable(d: Path) -> None:
    """A dir even root cannot write into (`chattr +i`); the module's teardown makes it writable again."""
    d.mkdir()
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")


def list_text_parquet(case: Path, sh: Shared) -> None:
    """A parquet corpus whose text column holds lists (its repr would enter pretraining)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [["第一条", "本法"], ["第二条"]]}), case / "d.parquet")


def remote_code_base(case: Path, sh: Shared) -> None:
    """model.base: a checkpoint whose config maps its classes to code it ships (auto_map); that code must not run."""
    shutil.copytree(sh.encoder, case / "enc")
    config = json.loads((case / "enc" / "config.json").read_text())
    config.update(model_type="xbert", auto_map={"AutoConfig": "configuration_x.XConfig",
                                                "AutoModelForMaskedLM": "modeling_x.XForMaskedLM"})
    (case / "enc" / "config.json").write_text(json.dumps(config))
    for name in ("configuration_x.py", "modeling_x.py"):
        (case / "enc" / name).write_text("open('REMOTE-CODE-RAN', 'w').close()\n")


def notes_in_output(case: Path, sh: Shared) -> None:
    """A bertpipe output the user added a file to."""
    out = case / "work" / "prepare"
    out.mkdir(parents=True)
    (out / "a.txt").write_text("written by bertpipe\n")
    (out / "manifest.json").write_text(json.dumps({"fingerprint": "0" * 32, "files": ["a.txt"]}))
    (out / "NOTES.txt").write_text("my notes\n")


CASES = [
    # ---- params file and overrides (every command loads them first)
    Case("params-gb18030", ["config"], r"params\.yaml:2: expected UTF-8", b"paths: {work: work}\n# " + GB),
    Case("params-binary", ["config"], r"params\.yaml(:\d+)?: ", _rand(3000, 1)),
    Case("params-bad-yaml", ["config"], r"params\.yaml:\d+: not valid YAML", b"paths: {work: [\n"),
    Case("params-not-mapping", ["config"], r"params\.yaml: expected a mapping", b"- a\n- b\n"),
    Case("params-duplicate-key", ["config"], r"params\.yaml:3: duplicate key 'paths' \(first at line 1\)",
         b"paths: {work: w}\nmodel: {language: zh}\npaths: {work: x}\n"),
    Case("params-duplicate-nested-key", ["config"], r"params\.yaml:3: duplicate key 'max_steps'",
         b"pretrain:\n  max_steps: 1\n  max_steps: 2\n"),
    Case("params-duplicate-profile", ["config"], r"params\.yaml:3: duplicate key 'demo'",
         b"profiles:\n  demo: {pretrain: {max_steps: 1}}\n  demo: {pretrain: {max_steps: 2}}\n"),
    Case("params-top-false", ["config"], r"params\.yaml: expected a mapping .*\(got False\)", b"false\n"),
    Case("params-top-zero", ["config"], r"params\.yaml: expected a mapping .*\(got 0\)", b"0\n"),
    Case("params-top-empty-list", ["config"], r"params\.yaml: expected a mapping .*\(got \[\]\)", b"[]\n"),
    Case("params-alias-bomb", ["config"], r"params\.yaml: expands to more than [\d,]+ values through its aliases",
         BOMB),
    Case("params-too-many-aliases", ["config"], r"params\.yaml:\d+: more than 100 aliases",
         b"x: &x 1\nl: [" + b", ".join([b"*x"] * 101) + b"]\n"),
    Case("params-nested-500", ["config"], r"params\.yaml:65: nested deeper than 64 levels",
         "".join(" " * i + "k:\n" for i in range(500)).encode() + b" " * 500 + b"v: 1\n"),
    Case("params-flow-nested-500", ["config"], r"params\.yaml:1: nested deeper than 64 levels",
         b"paths: " + b"[" * 500 + b"]" * 500 + b"\n"),
    Case("params-unknown-key", ["config"], r"params\.yaml: prepare\.bogus: unknown key", {"prepare": {"bogus": 1}}),
    Case("params-wrong-type", ["config"], r"pretrain\.max_steps: .*got 'ten'", {"pretrain": {"max_steps": "ten"}}),
    Case("params-huge-value", ["config"], r"model\.language: .*\(got 'zzz.*chars\)",
         {"model": {"language": "z" * 2_000_000}}),
    Case("params-task-dotted-name", ["config"], r"finetune\.tasks: .*'ner\.v2'", task("ner.v2", **NER)),
    Case("params-profiles-not-mapping", ["config", "--profile", "demo"], r"profiles: expected a mapping",
         {"profiles": ["demo"]}),
    Case("params-train-override-out-of-range", ["stages", "--set", "finetune.tasks.t.train_overrides={lr: -1}"],
         r"finetune\.tasks\.t\.train_overrides\.lr: Input should be greater than 0 \(got -1\)", task("t", **CLS)),
    Case("params-train-override-typo", ["config", "--set", "finetune.tasks.t.train_overrides={class_weight: balance}"],
         r"finetune\.tasks\.t\.train_overrides\.class_weight: .*\(got 'balance'\)", task("t", **CLS)),
    Case("params-distill-override-zero-epochs", ["config", "--set", "distill.train_overrides={epochs: 0}"],
         r"distill\.train_overrides\.epochs: Input should be greater than 0"),
    Case("params-search-trials-bool", ["config", "--set", "finetune.search.trials=true"],
         r"finetune\.search\.trials: Input should be a valid integer \(got True\)"),
    Case("params-seeds-repeated", ["config", "--set", "finetune.train.seeds=[1, 2, 1]"],
         r"finetune\.train\.seeds: .*\[1\] listed more than once"),
    Case("params-search-max-seq-len", ["config", "--set", "finetune.search.space={max_seq_len: [64, 1024]}"],
         r"finetune\.search\.space: .*'max_seq_len' is applied before the search"),
    Case("params-missing", ["config", "--params", "nope.yaml"], r"nope\.yaml: params file does not exist"),
    Case("params-is-dir", ["config", "--params", "adir"], r"adir: cannot read the params file",
         setup=lambda c, sh: (c / "adir").mkdir()),
    Case("set-profile-bracket", ["config", "--set", "profile=["], r"profile '\[' is not defined"),
    Case("set-profile-list", ["config", "--set", "profile=[1]"], r"profile: expected a profile name"),
    Case("set-unknown-key", ["config", "--set", "nosuch.key=1"], r"nosuch: unknown key"),
    Case("config-unknown-section", ["config", "pretrian"],
         r"config pretrian: no section 'pretrian' in params; known: base, .*pretrain, .*vocab$"),
    Case("config-past-a-value", ["config", "pretrain.max_steps.x"], r"no section 'x' in pretrain\.max_steps"),
    Case("set-no-equals", ["config", "--set", "pretrain.max_steps"], r"KEY\.PATH=VALUE"),
    Case("set-not-a-section", ["config", "--set", "paths.work.x=1"], r"paths\.work is not a section"),
    Case("profile-undefined", ["config", "--profile", "nope"], r"profile 'nope' is not defined"),
    Case("stage-input-missing", ["vocab"], r"input 'corpus'.* does not exist|does not exist"),
    # ---- run: rejected before Prefect starts
    Case("run-until-bogus", ["run", "--until", "bogus"], r"--until 'bogus': not a stage"),
    Case("run-base-remote-code", ["run"], r"model\.base: .*enc: this checkpoint needs code of its own "
         r"\(AutoConfig, AutoModelForMaskedLM in its auto_map\), and remote code is not run",
         {"model": {"base": "enc"}}, setup=remote_code_base),
    Case("finetune-base-remote-code", ["finetune", "--task", "t", "--encoder", "base"],
         r"model\.base: .*enc: this checkpoint needs code of its own .*remote code is not run",
         {"model": {"base": "enc"}, **task("t", **CLS)}, {"t.jsonl": b'{"text": "a", "label": "x"}\n'},
         setup=remote_code_base),
    # a missing local path is "does not exist", expanded ({raw} is paths.raw), never a complaint about hub repo ids
    Case("run-tokenizer-raw-missing", ["run"], r"model\.tokenizer: /.*/data/tokenizer: does not exist",
         {"paths": {"raw": "data"}, "model": {"tokenizer": "{raw}/tokenizer"}}, setup=lambda c, sh: (c / "data").mkdir()),
    Case("run-base-dot-path-missing", ["run"], r"model\.base: /.*/my-bert: does not exist",
         {"model": {"base": "./my-bert"}}),
    # ---- data new-laws
    Case("new-laws-since-garbage", ["data", "new-laws", "--since", "garbage", "--out", "n.jsonl"],
         r"--since 'garbage': expected a date as YYYY-MM-DD"),
    Case("new-laws-since-slashes", ["data", "new-laws", "--since", "2022/01/01", "--out", "n.jsonl"],
         r"--since '2022/01/01'"),
    Case("new-laws-since-impossible", ["data", "new-laws", "--since", "2022-02-30", "--out", "n.jsonl"],
         r"--since '2022-02-30'"),
    Case("new-laws-negative-limit", ["data", "new-laws", "--limit", "-1", "--out", "n.jsonl"], r"--limit -1"),
    Case("new-laws-truncated-db", ["data", "new-laws", "--out", "n.jsonl"], r"raw/china_law/laws\.db: .*malformed",
         {"paths": {"raw": "raw"}}, setup=lambda c, sh: laws_copy(c, sh, lambda b: b[: len(b) // 3])),
    Case("new-laws-not-sqlite", ["data", "new-laws", "--out", "n.jsonl"], r"laws\.db: not a readable SQLite",
         {"paths": {"raw": "raw"}}, setup=lambda c, sh: laws_copy(c, sh, lambda b: b"not a database\n" * 100)),
    Case("new-laws-empty-db", ["data", "new-laws", "--out", "n.jsonl"], r"laws\.db: .*no such table",
         {"paths": {"raw": "raw"}}, setup=lambda c, sh: laws_copy(c, sh, lambda b: b"")),
    Case("new-laws-no-db", ["data", "new-laws", "--out", "n.jsonl"], r"laws\.db: laws\.db not found",
         {"paths": {"raw": "raw"}}, setup=lambda c, sh: (c / "raw").mkdir()),
    Case("new-laws-out-is-dir", ["data", "new-laws", "--out", "outdir"], r"--out outdir: is a directory",
         setup=lambda c, sh: (c / "outdir").mkdir()),
    Case("new-laws-out-not-writable", ["data", "new-laws", "--limit", "3", "--out", "locked/n.jsonl"],
         r"--out locked/n\.jsonl: cannot write it \(Operation not permitted\)",
         setup=lambda c, sh: immutable(c / "locked")),
    # ---- data samples (offline: only the download cache can serve it)
    Case("samples-unknown", ["data", "samples", "nope", "--no-dvc"], r"unknown sample 'nope'"),
    Case("samples-user-file", ["data", "samples", "china_law", "--no-dvc"],
         r"raw/china_law/laws\.db: was not unpacked by bertpipe", {"paths": {"raw": "raw"}},
         files={"raw/china_law/laws.db": b"my own database\n", "raw/china_law/notes.md": b"mine\n"}),
    # ---- prepare
    Case("prepare-latin1", ["prepare"], r"d\.txt:21: .*expected UTF-8", txt_source("d.txt"),
         {"d.txt": "第一条 本法。\n".encode() * 20 + "café résumé\n".encode("latin-1")}, slow=True),
    Case("prepare-binary", ["prepare"], r"d\.txt", txt_source("d.txt"), {"d.txt": _rand(20000, 2)}, slow=True),
    Case("prepare-empty-file", ["prepare"], r"d\.txt|prepare\.domain", txt_source("d.txt"), {"d.txt": b""}, slow=True),
    Case("prepare-all-duplicates", ["prepare"], r"prepare\.domain: 1 of 200 documents left",
         txt_source("d.txt"), {"d.txt": "第一条 为了保护公民的合法权益，根据宪法，制定本法。\n".encode() * 200}),
    Case("prepare-huge-line", ["prepare"], r"prepare\.domain: no document left after cleaning \(too_long=1\)",
         txt_source("d.txt"), {"d.txt": ("法" * 400_000).encode()}, slow=True),
    Case("prepare-jsonl-array", ["prepare"], r"d\.jsonl:2: ",
         {"prepare": {"domain": {"sources": [{"path": "d.jsonl", "format": "jsonl", "name": "j"}]}}},
         {"d.jsonl": '{"text": "第一条 本法。"}\n[1, 2]\n'.encode()}, slow=True),
    Case("prepare-parquet-list-text", ["prepare"], r"d\.parquet:1: field 'text' holds a list",
         {"prepare": {"domain": {"sources": [{"path": "d.parquet", "name": "p"}]}}}, setup=list_text_parquet,
         slow=True),
    Case("prepare-truncated-sqlite", ["prepare"], r"raw/china_law/laws\.db: .*malformed",
         {"prepare": {"domain": {"sources": [laws_source(Path("raw"), FEW_LAWS)]}}},
         setup=lambda c, sh: laws_copy(c, sh, lambda b: b[:16384]), slow=True),
    Case("prepare-notes-in-output", ["prepare"], r"work/prepare/NOTES\.txt: not written by bertpipe",
         setup=notes_in_output),
    Case("prepare-sqlite-hash-path", ["prepare"], r"laws #1\.db does not exist",
         {"prepare": {"domain": {"sources": [{**laws_source(Path("raw"), FEW_LAWS), "path": "laws #1.db"}]}}},
         files={"laws ": b"a file the old URI would have opened instead\n"}),
    Case("prepare-dir-in-the-way", ["prepare"], r"work/prepare: not written by bertpipe",
         files={"work/prepare/mine.csv": b"a,b\n"}, slow=True),
    # ---- finetune task data
    Case("finetune-gb18030", FT, r"t\.jsonl:1: expected UTF-8", task("t", **CLS),
         {"t.jsonl": '{"text": "好", "label": "pos"}\n'.encode("utf-16")}, slow=True),
    Case("finetune-conll-gb18030", FT, r"t\.txt:1: expected UTF-8", task("t", **NER),
         {"t.txt": CONLL.decode().encode("gb18030")}),
    Case("finetune-binary", FT, r"t\.txt", task("t", **NER), {"t.txt": _rand(5000, 3)}, slow=True),
    Case("finetune-conll-token-col", FT, r"t\.txt:1: conll_token_col 5", task("t", **NER, conll_token_col=5),
         {"t.txt": CONLL}),
    Case("finetune-missing-label", FT, r"t\.jsonl:1: missing field 'label'", task("t", **CLS),
         {"t.jsonl": '{"text": "好"}\n'.encode()}, slow=True),
    Case("finetune-empty-file", FT, r"t\.jsonl.*no training examples", task("t", **CLS), {"t.jsonl": b""}, slow=True),
    Case("finetune-no-such-task", ["finetune", "--task", "nope"],
         r"no finetune task matches --task nope in this config's pipeline \(params: finetune\.tasks; --task: none\)$"),
    Case("finetune-no-such-encoder", ["finetune", "--task", "t", "--encoder", "tapt"],
         r"no finetune task matches --task t --encoder tapt .*; --task: t; --encoder: base\)$", task("t", **CLS),
         {"t.jsonl": b'{"text": "a", "label": "x"}\n'}),
    Case("finetune-one-label-raw", FT, r": /.*/data/t\.jsonl: classification needs at least two labels",
         {"paths": {"raw": "data"}, **task("t", **{**CLS, "train": "{raw}/t.jsonl"})},
         {"data/t.jsonl": "".join(json.dumps({"text": f"第{i}条评论", "label": "pos"}) + "\n"
                                  for i in range(40)).encode()}),
    Case("finetune-list-text", FT, r"t\.jsonl:2: field 'text' holds a list; expected a string", task("t", **CLS),
         {"t.jsonl": '{"text": "好", "label": "pos"}\n{"text": ["a", "b"], "label": "neg"}\n'.encode()}),
    Case("finetune-list-label", FT, r"t\.jsonl:1: field 'label' holds a list; expected a string", task("t", **CLS),
         {"t.jsonl": '{"text": "好", "label": ["pos"]}\n'.encode()}),
    Case("finetune-ner-overlapping-spans", FT, r"t\.jsonl:1: spans \[3, 6, LOC\] and \[4, 6, ORG\] overlap",
         task("t", type="ner", format="jsonl", train="t.jsonl"),
         {"t.jsonl": json.dumps({"text": "张三去北京市了", "spans": [{"start": 3, "end": 6, "label": "LOC"},
                                                              {"start": 4, "end": 6, "label": "ORG"}]}).encode()}),
    Case("finetune-one-example-per-label", FT,
         r"finetune\.tasks\.t: the dev split is empty: .*10,000 of the 10,000 labels have fewer than 3 examples",
         task("t", **CLS), {"t.jsonl": "".join(json.dumps({"text": f"第{i}条评论内容", "label": f"c{i}"}) + "\n"
                                              for i in range(10_000)).encode()}),
    Case("finetune-blank-label", FT, r"t\.csv:4: field 'label' is empty",
         task("t", type="classification", format="csv", train="t.csv"),
         {"t.csv": ("text,label\n" + "".join(f"第{i}条评论,{['pos', 'neg', ' '][i % 3]}\n" for i in range(60))).encode()}),
    Case("finetune-repeated-id", FT, r"t\.jsonl:2: id '7' repeats the id of .*t\.jsonl:1", task("t", **CLS),
         {"t.jsonl": "".join(json.dumps({"id": 7, "text": f"第{i}条评论", "label": "ab"[i % 2]}) + "\n"
                             for i in range(90)).encode()}),
    Case("finetune-test-ratio-zero", FT, r"finetune\.tasks\.t: no test file and test_ratio is 0",
         task("t", **CLS, test_ratio=0), {"t.jsonl": "".join(json.dumps({"text": f"第{i}条评论", "label": "ab"[i % 2]})
                                                           + "\n" for i in range(40)).encode()}),
]


# ---------------------------------------------------------------- harness


@pytest.fixture(scope="module")
def shared(tmp_path_factory, sample_raw, zh_tokenizer_dir):
    from tests.synthetic import tiny_encoder

    base = tmp_path_factory.mktemp("bad-inputs")
    enc = tiny_encoder(base / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    root = base / "bad inputs #1 ü"
    root.mkdir()
    yield Shared(root, base / "state", sample_raw, enc, zh_tokenizer_dir)
    subprocess.run(["chattr", "-R", "-i", str(root)], capture_output=True)


def base_params(sh: Shared) -> dict:
    return {
        "paths": {"raw": str(sh.raw), "work": "work", "state": str(sh.state)},
        "model": {"base": str(sh.encoder), "tokenizer": str(sh.tokenizer), "language": "zh"},
        "prepare": {"domain": {"sources": [laws_source(sh.raw, FEW_LAWS)]}, "general": {"enabled": False}},
        "finetune": {"tasks": {}},  # prepare's only inputs are the sources (a case adds its own task)
    }


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def snapshot(root: Path) -> dict[str, str]:
    """Every file and dir of the case (state excluded): sha256 for files, 'dir' for dirs. Lock files are allowed."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if rel.startswith(".bertpipe") or p.name.endswith(".lock"):
            continue
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def case_env(cwd: Path) -> dict:
    env = env_for(cwd, prefect="ephemeral")  # every case ends before a flow would start
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "COLUMNS": "200"})  # offline: the cache or nothing
    return env


def run_case(case: Case, sh: Shared, cwd: Path) -> subprocess.CompletedProcess:
    return invoke(case.argv, cwd, case_env(cwd))


def check(case: Case, sh: Shared, cwd: Path) -> float:
    before = snapshot(cwd)
    shared_stamp = (sh.raw / "china_law" / "laws.db").stat().st_mtime_ns
    t0 = time.perf_counter()
    proc = run_case(case, sh, cwd)
    took = time.perf_counter() - t0
    both = proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0, f"{case.id}: exit 0\n{both[-3000:]}"
    assert "Traceback" not in both, f"{case.id}: traceback\n{both[-5000:]}"
    assert len(errors) == 1, f"{case.id}: expected one error line, got {errors}\n{both[-3000:]}"
    assert re.search(case.expect, errors[0]), f"{case.id}: {errors[0]!r} does not match {case.expect!r}"
    assert len(errors[0]) < 600, f"{case.id}: error line of {len(errors[0])} chars"
    assert snapshot(cwd) == before, f"{case.id}: files changed or dirs left behind"
    assert (sh.raw / "china_law" / "laws.db").stat().st_mtime_ns == shared_stamp
    return took


def make_case_dir(case: Case, sh: Shared) -> Path:
    d = sh.root / case.id
    d.mkdir()
    if isinstance(case.params, bytes):
        (d / "params.yaml").write_bytes(case.params)
    else:
        params = merge(base_params(sh), case.params or {})
        (d / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    for rel, content in case.files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(content)
    if case.setup is not None:
        case.setup(d, sh)
    return d


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in CASES])
def test_bad_input_is_one_line(case: Case, shared: Shared):
    took = check(case, shared, make_case_dir(case, shared))
    if case.id == "run-until-bogus":
        assert took < 60, f"--until was checked only after {took:.0f} s (Prefect started first?)"


@pytest.mark.slow
def test_full_disk_is_one_line_and_leaves_nothing(shared: Shared):
    """prepare writing onto a 64 KiB tmpfs: ENOSPC becomes one line naming the output dir; the temp dir is gone."""
    case = Case("full-disk", ["prepare"], r"work: no space left on device while building prepare")
    d = make_case_dir(case, shared)
    (d / "work").mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d / "work")],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        check(case, shared, d)
        assert [p.name for p in (d / "work").iterdir() if not p.name.endswith(".lock")] == []
    finally:
        subprocess.run(["umount", str(d / "work")], check=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes regardless of permissions")
def test_unreadable_params_file(shared: Shared):
    case = Case("params-unreadable", ["config"], r"params\.yaml: cannot read the params file")
    d = make_case_dir(case, shared)
    (d / "params.yaml").chmod(0)
    try:
        check(case, shared, d)
    finally:
        (d / "params.yaml").chmod(0o644)


def test_sqlite_path_with_hash_is_read_not_created(shared: Shared):
    """`#` in a path once cut the sqlite URI short and opened (created) another file read-write."""
    d = shared.root / "hash-path"
    d.mkdir()
    raw = d / "raw #2"
    (raw / "china_law").mkdir(parents=True)
    shutil.copyfile(shared.raw / "china_law" / "laws.db", raw / "china_law" / "laws.db")
    (d / "params.yaml").write_text(yaml.safe_dump({"paths": {"raw": "raw #2", "state": str(shared.state)}}))
    proc = run_case(Case("ok", ["data", "new-laws", "--since", "2022-01-01", "--limit", "5", "--out", "n.jsonl"],
                         ""), shared, d)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len((d / "n.jsonl").read_text(encoding="utf-8").splitlines()) == 5
    assert sorted(p.name for p in d.iterdir()) == [".bertpipe", "n.jsonl", "params.yaml", "raw #2"]
