"""The base-vs-adapted report from real finetune outputs of two tiny encoders, with baselines trained on the
materialised task splits, bootstrap intervals, verdicts and the fair encoder comparison, through the stage contract."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bertpipe.graph.pipeline import family_stages, load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.evaluate.stage import compare, interval, verdict
from tests import synthetic as S
from bertpipe.core.stage import run_stage, write_json
from bertpipe.lib.labelled import SPLITS_JSON, read_task
from bertpipe.lib.layout import finetune_pairs
from bertpipe.lib.layout import task_dir
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.splits.declare import splits_stage
from tests.corpus import law_texts

torch.set_num_threads(1)
def evaluate(cfg):
    """The graph's evaluate stage: the finetune stages behind its inputs come with it (``Stage.sources_from``)."""
    return family_stages(cfg, "evaluate")["evaluate"]


NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def _ft(task_type: str, values: dict[str, dict[str, float]], primary: str) -> dict:
    return {"type": task_type, "primary": primary, "seeds": [int(s) for s in values],
            "per_seed": {s: {"test": v, "dev": v} for s, v in values.items()}}


def test_compare_pairs_seeds_and_handles_one_encoder():
    res = compare(
        {
            ("t", "base"): _ft("classification", {"1": {"macro_f1": 0.5}, "2": {"macro_f1": 0.7}}, "macro_f1"),
            ("t", "adapted"): _ft("classification", {"1": {"macro_f1": 0.6}, "2": {"macro_f1": 0.9}}, "macro_f1"),
            ("n", "adapted"): _ft("ner", {"1": {"f1": 0.4}}, "f1"),
        },
        "test",
    )
    t = res["tasks"]["t"]
    assert t["base"]["macro_f1"]["mean"] == pytest.approx(0.6) and t["adapted"]["macro_f1"]["mean"] == pytest.approx(0.75)
    assert t["delta"]["macro_f1"]["values"] == pytest.approx([0.1, 0.2])
    assert t["delta"]["macro_f1"]["std"] == pytest.approx(0.0707106, rel=1e-4)
    assert "delta" not in res["tasks"]["n"] and res["encoders"] == ["base", "adapted"]


def test_verdicts_in_plain_words():
    t = {"type": "classification", "primary": "macro_f1",
         "baselines": {"majority": {"macro_f1": 0.07}, "tfidf": {"macro_f1": 0.43}},
         "base": {"macro_f1": {"mean": 0.34}}, "adapted": {"macro_f1": {"mean": 0.46}},
         "deltas": {"adapted": {"macro_f1": {"mean": 0.12, "ci95": [0.05, 0.19], "values": [0.12], "seeds": [1]}}}}
    assert verdict(t) == ("adapted beats base by +0.120 macro_f1 (95% CI +0.050..+0.190), one seed; adapted beats "
                          "the TF-IDF baseline by +0.030.")
    t["adapted"]["macro_f1"]["mean"] = 0.07
    t["deltas"]["adapted"]["macro_f1"] = {"mean": 0.01, "ci95": [-0.02, 0.04], "values": [0.01], "seeds": [1]}
    assert verdict(t) == ("adapted and base cannot be told apart on macro_f1 (Δ +0.010 macro_f1 (95% CI "
                          "-0.020..+0.040) includes 0); base does not beat the TF-IDF baseline (0.340 vs 0.430).")
    t["deltas"]["adapted"]["macro_f1"] = {"mean": -0.2, "ci95": [-0.3, -0.1], "values": [-0.2], "seeds": [1]}
    assert verdict(t).startswith("adapted is worse than base by -0.200 macro_f1")
    ner = {"type": "ner", "primary": "f1", "baselines": {"majority": {"f1": 0.0}}, "adapted": {"f1": {"mean": 0.0}}}
    assert verdict(ner) == "adapted scores 0.000 f1; adapted does not beat the all-O baseline (0.000 vs 0.000)."


def test_a_verdict_needs_every_seed_to_agree():
    t = {"type": "classification", "primary": "macro_f1", "base": {"macro_f1": {"mean": 0.5}},
         "adapted": {"macro_f1": {"mean": 0.6}},
         "deltas": {"adapted": {"macro_f1": {"mean": 0.1, "ci95": [0.02, 0.2], "values": [0.2, 0.15, -0.05],
                                             "seeds": [1, 2, 3]}}}}
    assert verdict(t) == ("adapted − base is +0.100 macro_f1 (95% CI +0.020..+0.200), but seeds [3] go the other "
                          "way (+0.200, +0.150, -0.050): no verdict.")
    t["deltas"]["adapted"]["macro_f1"]["values"] = [0.2, 0.15, 0.01]
    assert verdict(t).startswith("adapted beats base by +0.100 macro_f1 (95% CI +0.020..+0.200), every one of 3 "
                                 "seeds agrees")


def test_a_degenerate_encoder_gets_no_difference_and_the_verdict_names_it():
    collapsed = _ft("classification", {"1": {"macro_f1": 0.33}}, "macro_f1")
    collapsed.update(degenerate=True, degenerate_reason="predicts one class ('pos') for all 300 examples")
    collapsed["per_seed"]["1"]["degenerate"] = collapsed["degenerate_reason"]
    res = compare({("t", "base"): collapsed,
                   ("t", "adapted"): _ft("classification", {"1": {"macro_f1": 0.8}}, "macro_f1")}, "test")
    t = res["tasks"]["t"]
    assert "delta" not in t and "deltas" not in t and t["degenerate"] == {"base": collapsed["degenerate_reason"]}
    t["baselines"] = {"majority": {"macro_f1": 0.33}}
    assert verdict(t) == ("adapted vs base is not informative: base is degenerate (predicts one class ('pos') for "
                          "all 300 examples); no difference or interval is reported; adapted beats the "
                          "majority-class baseline by +0.470.")


def test_a_class_an_encoder_never_gets_right_that_a_baseline_finds_is_named_in_the_verdict_and_report():
    from bertpipe.lib.labelled import Example
    from bertpipe.lib.measures import baselines as BL
    from bertpipe.lib.measures import metrics as M
    from bertpipe.stages.evaluate import report as R
    from bertpipe.stages.evaluate.stage import lost_classes

    rows = S.keyword_classification(240, seed=3, labels=("pos", "neg", "mid"))
    train, test = [[Example(id=str(r["id"]), text=r["text"], label=r["label"]) for r in part]
                   for part in (rows[:180], rows[180:])]
    scored = BL.scored_baselines("classification", {"train": train, "test": test}, ["pos", "neg", "mid"])
    gold = [ex.label for ex in test]
    labels = ["pos", "neg", "mid"]
    # adapted calls every 'mid' example 'pos' (two classes predicted, so not degenerate); base gets them all right
    adapted = M.classification_metrics(gold, ["pos" if g == "mid" else g for g in gold], labels)
    base = M.classification_metrics(gold, gold, labels)
    lost = lost_classes({"base": base[1], "adapted": adapted[1]}, {n: d for n, (_, d) in scored.items()})
    assert lost == {"adapted": {"mid": {"support": 20, "baseline": "tfidf",
                                        "baseline_recall": scored["tfidf"][1]["per_class"]["mid"]["recall"]}}}
    t = {"type": "classification", "primary": "macro_f1", "baselines": {n: f for n, (f, _) in scored.items()},
         "base": {"macro_f1": {"mean": base[0]["macro_f1"]}}, "adapted": {"macro_f1": {"mean": adapted[0]["macro_f1"]}},
         "lost_classes": lost}
    r = lost["adapted"]["mid"]["baseline_recall"]
    assert r > 0.9 and verdict(t).endswith(
        f"; adapted never gets class 'mid' right (20 test examples, recall 0), which the TF-IDF baseline does "
        f"(recall {r:.3f}).")
    t["verdict"] = verdict(t)
    report = R.markdown({"encoders": ["base", "adapted"], "split": "test", "tasks": {"cls": t}}, {}, {})
    assert f"- **cls**: {t['verdict']}" in report.splitlines()
    # NER: the lexicon finds PER; an encoder that finds only LOC loses PER; all-O finds nothing, so it names nothing
    ner_train = [Example(id=str(i), text=f"{n}在{c}工作", spans=[(0, 2, "PER"), (3, 5, "LOC")])
                 for i, (n, c) in enumerate([("张三", "北京"), ("李四", "上海"), ("王五", "广州")])]
    ner_test = [Example(id="t", text="李四去北京", spans=[(0, 2, "PER"), (3, 5, "LOC")])]
    found = {n: d for n, (_, d) in BL.scored_baselines("ner", {"train": ner_train, "test": ner_test}).items()}
    only_loc = M.ner_metrics([["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]], [["O", "O", "O", "B-LOC", "I-LOC"]])[1]
    assert lost_classes({"adapted": only_loc}, found) == {
        "adapted": {"PER": {"support": 1, "baseline": "lexicon", "baseline_recall": 1.0}}}
    assert "adapted never gets entity type 'PER' right (1 test example," in verdict(
        {"type": "ner", "primary": "f1", "adapted": {"f1": {"mean": 0.5}},
         "lost_classes": lost_classes({"adapted": only_loc}, found)})


def _write_predictions(d, recs):
    d.mkdir(parents=True)
    (d / "predictions_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return d


def test_confusion_matrix_names_classes_an_installed_font_draws_and_keeps_a_long_title_whole(tmp_path):
    """Class names that are not ASCII but that a font on the machine draws (Greek and Cyrillic: matplotlib's DejaVu
    Sans) are on both axes, not indices; names no font draws fall back to indices (their key in report.md); a title
    wider than the matrix is inside the saved image, not cut at its edges."""
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font
    from PIL import Image

    from bertpipe.stages.evaluate import report as R

    labels = ["Ωμέγα", "Дельта"]
    fig = R.confusion_figure(labels, [[4, 1], [2, 3]], "t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels == [t.get_text() for t in ax.get_yticklabels()]
    cmap = FT2Font(findfont(FontProperties(family=ax.get_xticklabels()[0].get_fontfamily()))).get_charmap()
    assert all(ord(c) in cmap for lab in labels for c in lab)  # the font the names are drawn in has their glyphs
    unknown = ["\U000f0001", "\U000f0002"]  # private use: no installed font has them
    fig2 = R.confusion_figure(unknown, [[1, 0], [0, 1]], "t")
    assert [t.get_text() for t in fig2.axes[0].get_xticklabels()] == ["0", "1"]
    assert "the key in report.md" in fig2.axes[0].get_xlabel()

    title = "a_task_with_a_rather_long_name_for_its_reviews_v2 / adapted (test)"
    fig3 = R.confusion_figure(labels, [[4, 1], [2, 3]], title)
    fig3.canvas.draw()
    title_px = fig3.axes[0].title.get_window_extent().width * 110 / fig3.dpi  # at the saved 110 dpi
    assert title_px > fig3.get_figwidth() * 110  # wider than the figure as laid out
    png = R.confusion_png(tmp_path / "cm.png", labels, [[4, 1], [2, 3]], title)
    assert Image.open(png).width >= title_px


def test_interval_pairs_examples_by_id_and_falls_back_to_seeds(tmp_path):
    gold = ["a", "b"] * 50
    base = _write_predictions(tmp_path / "b", [{"id": str(i), "label": g, "pred": "a"} for i, g in enumerate(gold)])
    recs = [{"id": str(i), "label": g, "pred": g} for i, g in enumerate(gold)]
    adapted = _write_predictions(tmp_path / "a", recs[::-1])  # another order: paired by id, not by line
    t = {"type": "classification", "primary": "macro_f1", "deltas": {"adapted": {"macro_f1": {"values": [2 / 3]}}}}
    ci, how = interval(t, "adapted", base, adapted, "test", 500, 0)
    assert 0.5 < ci[0] < 2 / 3 < ci[1] <= 1.0 and "100 test examples" in how
    assert interval(t, "adapted", base, adapted, "test", 500, 0) == (ci, how)
    # several seeds widen it; without per-example predictions only the seeds are resampled
    t["deltas"]["adapted"]["macro_f1"]["values"] = [0.2, 2 / 3, 0.9]
    wide, how = interval(t, "adapted", base, adapted, "test", 500, 0)
    assert wide[0] < ci[0] and "3 seeds" in how
    only, how = interval(t, "adapted", tmp_path / "none", tmp_path / "none", "test", 500, 0)
    assert 0.2 <= only[0] < only[1] <= 0.9 and how.startswith("bootstrap over 3 seeds")
    t["deltas"]["adapted"]["macro_f1"]["values"] = [0.1]
    assert interval(t, "adapted", tmp_path / "none", tmp_path / "none", "test", 500, 0)[0] is None


def _short_encoder(out, zh_tokenizer_dir, positions: int):
    """A tiny MLM encoder with only ``positions`` positions (the case that crashed evaluate after minutes)."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(1)
    tok = AutoTokenizer.from_pretrained(str(zh_tokenizer_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=positions)
    BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir, sample_raw):
    root = tmp_path_factory.mktemp("ev")
    base = S.tiny_encoder(root / "base_enc", zh_tokenizer_dir, layers=1, hidden=32, seed=0)
    _short_encoder(root / "work" / "pretrain" / "model", zh_tokenizer_dir, positions=64)
    corpus = root / "work" / "prepare" / "domain"
    corpus.mkdir(parents=True)
    texts = law_texts(sample_raw, 40)
    pq.write_table(pa.table({"text": texts[:30] + [""]}), corpus / "test.parquet")
    pq.write_table(pa.table({"text": texts[30:]}), corpus / "valid.parquet")
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(120, labels=("pos", "neg", "mid")))
    S.write_jsonl(root / "ner.jsonl", S.ner_sentences(60))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {base}}}
finetune:
  encoders: [base, adapted]
  train: {{lr: 1.0e-2, epochs: 6, batch_size: 8, max_seq_len: 48, seeds: [1, 2], early_stopping: {{patience: 0}}}}
  search: {{trials: 0}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
    ner: {{type: ner, format: jsonl, train: ner.jsonl}}
evaluate: {{mlm_max_texts: 20, mlm_max_seq_len: 256, bootstrap_samples: 300}}
""",
        encoding="utf-8",
    )
    return root


def test_report_base_vs_adapted(project):
    cfg = load_config(project / "params.yaml")
    with pytest.raises(BertpipeError, match="finetune"):  # nothing finetuned yet
        run_stage(evaluate(cfg), cfg, tracker_factory=NO_TRACKING)
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)  # the splits finetune and the baselines read
    for t, e in finetune_pairs(cfg):
        run_stage(finetune_stage(t, e), cfg, tracker_factory=NO_TRACKING)
    res = run_stage(evaluate(cfg), cfg)  # the real MLflow store under state/
    out = res.out
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert set(m["tasks"]) == {"cls", "ner"} and m["encoders"] == ["base", "adapted"] and m["split"] == "test"
    for task, primary in (("cls", "macro_f1"), ("ner", "f1")):
        t = m["tasks"][task]
        assert t["primary"] == primary and t["seeds"] == [1, 2]
        info = json.loads((task_dir(cfg, task) / SPLITS_JSON).read_text())
        assert t["test_sha256"] == info["splits"]["test"]["sha256"]
        for enc in ("base", "adapted"):
            ft = json.loads((cfg.work / "finetune" / task / enc / "metrics.json").read_text(encoding="utf-8"))
            assert t[enc][primary]["values"] == [ft["per_seed"][s]["test"][primary] for s in ("1", "2")]
        d = t["delta"][primary]
        assert d["mean"] == pytest.approx(t["adapted"][primary]["mean"] - t["base"][primary]["mean"])
        assert res.metrics[f"{task}.delta.{primary}"] == pytest.approx(d["mean"])
        lo, hi = d["ci95"]
        assert lo <= hi and "bootstrap over" in d["ci_method"] and "2 seeds" in d["ci_method"]
        assert res.metrics[f"{task}.delta.{primary}.ci95_lo"] == lo
        assert t["verdict"].startswith(("adapted ", "base ")) and t["verdict"].endswith(".")
    # baselines: trained on the materialised train split, scored on its test split, logged with the run
    cls_b, ner_b = m["tasks"]["cls"]["baselines"], m["tasks"]["ner"]["baselines"]
    assert set(cls_b) == {"majority", "tfidf"} and set(ner_b) == {"majority", "lexicon"}
    splits = read_task(task_dir(cfg, "cls"))
    counts = Counter(ex.label for ex in splits["train"])
    top = min(counts, key=lambda lab: (-counts[lab], lab))
    assert cls_b["majority"]["accuracy"] == pytest.approx(
        sum(ex.label == top for ex in splits["test"]) / len(splits["test"]))
    assert cls_b["tfidf"]["macro_f1"] > 0.8  # the keyword task is easy for character n-grams
    assert ner_b["majority"]["f1"] == 0.0 and ner_b["lexicon"]["f1"] > 0.5
    from bertpipe.infra.tracking import client

    logged = client(cfg).get_run(res.run_id).data.metrics  # baselines are logged with the evaluate run
    assert logged["cls.baseline_tfidf.macro_f1"] == pytest.approx(cls_b["tfidf"]["macro_f1"])
    assert logged["ner.baseline_lexicon.f1"] == pytest.approx(ner_b["lexicon"]["f1"])
    assert logged["cls.delta.macro_f1.ci95_hi"] == pytest.approx(m["tasks"]["cls"]["delta"]["macro_f1"]["ci95"][1])
    # the encoders: same words, per character; the 64-position encoder was clamped, not crashed
    ec = m["encoder_comparison"]
    assert ec["split"] == "test" and ec["window_chars"] == 62 and ec["dropped_windows"] == 0
    assert ec["base"]["spans"] == ec["adapted"]["spans"] > 0
    assert ec["base"]["masked_chars"] == ec["adapted"]["masked_chars"]  # one tokenizer: the very same tokens
    assert ec["delta"]["nll_per_char"] == pytest.approx(ec["adapted"]["nll_per_char"] - ec["base"]["nll_per_char"])
    assert ec["delta"]["ci95"][0] <= ec["delta"]["nll_per_char"] <= ec["delta"]["ci95"][1]
    assert "mlm" not in m and res.metrics["encoder.adapted.bits_per_char"] == ec["adapted"]["bits_per_char"]
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| cls | **macro_f1** |" in report and "| ner | **f1** |" in report and "TF-IDF + LR / lexicon" in report
    assert "## Verdicts" in report and m["tasks"]["cls"]["verdict"] in report
    assert "bits / char" in report and ec["verdict"].startswith("adapted ") and ec["verdict"] in report
    pictures = [line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert "figures/primary.png" in pictures and "figures/confusion_cls_adapted.png" in pictures
    assert all((out / p).stat().st_size > 1000 for p in pictures)
    # the one metrics file dvc.yaml declares: each task's primary metric per encoder and the difference, the encoders'
    # bits per character; no interval ends, no baselines (`dvc exp show` a column each, not dozens)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["cls"] == {"macro_f1": {e: res.metrics[f"cls.{e}.macro_f1"] for e in ("base", "adapted", "delta")}}
    assert set(summary) == {"cls", "ner", "encoder"} and set(summary["ner"]["f1"]) == {"base", "adapted", "delta"}
    assert summary["encoder"] == {"bits_per_char": {e: ec[e]["bits_per_char"] for e in ("base", "adapted")}}
    # unchanged inputs: the stage is skipped; a changed evaluate param reruns it
    assert run_stage(evaluate(cfg), cfg, tracker_factory=NO_TRACKING).skipped
    cfg2 = load_config(project / "params.yaml", overrides=["evaluate.encoder_comparison=false",
                                                           "evaluate.baselines=false"])
    res2 = run_stage(evaluate(cfg2), cfg2, tracker_factory=NO_TRACKING)
    m2 = json.loads((res2.out / "metrics.json").read_text())
    assert not res2.skipped and m2["encoder_comparison"] == {} and m2["tasks"]["cls"]["baselines"] == {}
    assert m2["tasks"]["cls"]["delta"] == m["tasks"]["cls"]["delta"]  # the interval is fixed by its seed
    # a domain corpus without test text: the encoder comparison says why it is missing, the task results stay
    pq.write_table(pa.table({"text": [""]}), cfg.work / "prepare" / "domain" / "test.parquet")
    cfg3 = load_config(project / "params.yaml", overrides=["evaluate.baselines=false"])
    res3 = run_stage(evaluate(cfg3), cfg3, tracker_factory=NO_TRACKING)
    m3 = json.loads((res3.out / "metrics.json").read_text())
    assert "no text" in m3["encoder_comparison"]["skipped"]
    assert m3["tasks"]["cls"]["delta"] == m2["tasks"]["cls"]["delta"]
    assert "Not scored: " in (res3.out / "report.md").read_text(encoding="utf-8")
