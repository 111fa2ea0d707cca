"""The end-of-run summary every door prints carries the register decision lines, only when register was
part of the run (quick: a registry.json on disk)."""

from __future__ import annotations

import json

from bertpipe.graph.pipeline import load_config
from bertpipe_prefect.flows.summary import summary


def test_the_summary_says_what_register_decided(tmp_path):
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    cfg = load_config(tmp_path / "params.yaml")
    reg = cfg.work / "register" / "registry.json"
    reg.parent.mkdir(parents=True)
    reg.write_text(json.dumps({"models": [
        {"name": "bp-sentiment", "version": "3", "aliases": ["challenger"], "below_floor": True,
         "reason": "f1 0.41 < floor 0.50"},
        {"name": "bp-ner", "version": "2", "aliases": ["champion"], "promoted": True, "reason": "f1 +0.03"},
        {"name": "bp-qa", "registered": False, "reason": "no test examples"},
    ]}))
    text = summary({"register": {"status": "built", "out": str(reg.parent)}}, cfg)
    assert "registered: bp-sentiment version 3 aliases [challenger] - BELOW THE FLOOR, not champion: f1 0.41" in text
    assert "registered: bp-ner version 2 aliases [champion] - new champion: f1 +0.03" in text
    assert "not registered: bp-qa (no test examples)" in text
    assert "register                                 built" in text
    # a run that stopped before register (`--until splits`) names no version an earlier run registered
    (cfg.work / "evaluate").mkdir()
    (cfg.work / "evaluate" / "report.md").write_text("# report\n")
    text = summary({"splits": {"status": "cached", "out": str(cfg.work / "splits")},
                    "register": {"status": "skipped", "out": str(reg.parent)}}, cfg)
    assert "registered" not in text and "report:" not in text, text
