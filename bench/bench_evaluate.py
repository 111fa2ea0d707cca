"""The evaluate stage's own work on demo-sized inputs (the bundled sample, demo caps): baselines per task, paired
bootstrap intervals, and the fair encoder comparison of two demo-sized encoders (2 layers, 128 hidden, 128 positions).

    .venv/bin/python bench/bench_evaluate.py [--threads 1] [--texts 300] [--stage]

Prints each part's seconds, the baselines' test scores (the numbers a finetuned model must beat), and the fair
comparison's cost as a ratio against one plain forward pass over the same windows (the floor for any MLM scoring).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertpipe.graph.pipeline import load_config  # noqa: E402
from bertpipe.lib.measures import baselines as BL  # noqa: E402
from bertpipe.lib.measures import bootstrap as B  # noqa: E402
from bertpipe.lib.measures import fair_mlm as F  # noqa: E402
from bertpipe.lib.measures import windows as W  # noqa: E402
from bertpipe.stages.evaluate.params import EvaluateParams  # noqa: E402
from bertpipe.stages.splits.stage import materialise  # noqa: E402


def demo_tasks(raw: Path) -> dict:
    """Each demo task's train/test examples after the demo caps, as the splits stage materialises them for finetune."""
    cfg = load_config(REPO / "params.yaml", overrides=["profile=demo", f"paths.raw={raw}"])
    ft = cfg.params.finetune
    out = {}
    for name, p in ft.tasks.items():
        data, *_ = materialise(name, p, ft.train, cfg.path, cfg.params.prepare.dedup)
        out[name] = (p.type, {"train": data["train"], "test": data["test"]})
    return out


def encoder(out: Path, tok_dir: Path, seed: int) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=512, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def plain_forward(model_dir: Path, windows, batch_size: int) -> float:
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    t = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(windows), batch_size):
            enc = tok([w for w, _ in windows[i : i + batch_size]], padding=True, return_tensors="pt")
            model(**enc)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--raw", default=str(REPO / ".bertpipe" / "test-raw"))
    ap.add_argument("--stage", action="store_true", help="also time the whole evaluate stage on demo-sized inputs")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    raw = Path(args.raw)
    print(f"load average {os.getloadavg()[0]:.1f}, torch threads {args.threads}")

    tasks = demo_tasks(raw)
    for name, (ttype, splits) in tasks.items():
        t = time.perf_counter()
        scores = BL.task_baselines(ttype, splits)
        secs = time.perf_counter() - t
        primary = "f1" if ttype == "ner" else "macro_f1"
        shown = ", ".join(f"{b} {s[primary]:.3f}" for b, s in scores.items())
        print(f"baselines {name:15s} train {len(splits['train']):5d} test {len(splits['test']):4d}: "
              f"{secs:6.2f}s  test {primary}: {shown}")

    # bootstrap: 1000 paired replicates of the majority vs TF-IDF predictions on a demo-sized test split
    _, splits = tasks["law_department"]
    gold = [ex.label for ex in splits["test"]]
    a, b = BL.majority_predictions(splits["train"], splits["test"]), BL.tfidf_predictions(splits["train"],
                                                                                           splits["test"])
    t = time.perf_counter()
    r = B.paired_bootstrap(gold, a, b, B.macro_f1, n=1000)
    print(f"bootstrap macro-F1, {len(gold)} examples x 1000: {time.perf_counter() - t:.2f}s "
          f"(TF-IDF − majority {r['mean']:+.3f}, 95% CI {r['ci95'][0]:+.3f}..{r['ci95'][1]:+.3f})")
    _, ner = tasks["msra_ner"]
    lex = BL.Lexicon.from_train(ner["train"])
    g = [ex.spans for ex in ner["test"]]
    t = time.perf_counter()
    r = B.paired_bootstrap(g, [[] for _ in g], [lex.match(ex.text) for ex in ner["test"]], B.entity_f1, n=1000)
    print(f"bootstrap entity F1, {len(g)} examples x 1000: {time.perf_counter() - t:.2f}s "
          f"(lexicon − all-O {r['mean']:+.3f}, 95% CI {r['ci95'][0]:+.3f}..{r['ci95'][1]:+.3f})")

    from tests.corpus import law_texts

    texts = law_texts(raw, args.texts)
    p = EvaluateParams(mlm_max_texts=args.texts, mlm_max_seq_len=128)
    with tempfile.TemporaryDirectory() as tmp:
        base = encoder(Path(tmp) / "base", raw / "bert-base-chinese", 0)
        adapted = encoder(Path(tmp) / "adapted", raw / "bert-base-chinese", 1)
        t = time.perf_counter()
        windows = W.choose_windows(texts, F.window_chars(128, [base]), p.mlm_mask_prob, p.mlm_seed)
        print(f"windows + jieba spans, {len(windows)} texts: {time.perf_counter() - t:.2f}s")
        t = time.perf_counter()
        res = F.compare_encoders({"base": base, "adapted": adapted}, texts, p)
        fair = time.perf_counter() - t
        plain = plain_forward(base, windows, p.mlm_batch_size) + plain_forward(adapted, windows, p.mlm_batch_size)
    print(f"fair comparison of 2 encoders on {res['base']['windows']} windows ({res['base']['masked_chars']} masked "
          f"chars): {fair:.2f}s; plain forward passes {plain:.2f}s; ratio {fair / plain:.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.stage:
        stage_time(tasks, texts, raw)


def _finetune_dir(out: Path, ttype: str, test: list, preds: list) -> None:
    """A finetune output as evaluate reads it (metrics.json, predictions_test.jsonl), holding baseline predictions."""
    import json

    from bertpipe.core.stage import write_json
    from bertpipe.lib.measures import metrics as M

    out.mkdir(parents=True)
    if ttype == "ner":
        flat, details = BL.ner_scores(test, preds), {}
        recs = [{"id": ex.id, "text": ex.text, "gold": [list(s) for s in ex.spans], "pred": [list(s) for s in p]}
                for ex, p in zip(test, preds)]
    else:
        labels = sorted({ex.label for ex in test} | set(preds))
        flat, details = M.classification_metrics([ex.label for ex in test], preds, labels)
        recs = [{"id": ex.id, "label": ex.label, "pred": p} for ex, p in zip(test, preds)]
    write_json(out / "metrics.json", {"type": ttype, "primary": "f1" if ttype == "ner" else "macro_f1", "seeds": [1],
                                      "per_seed": {"1": {"dev": flat, "test": flat, "test_details": details,
                                                         "saved": True}}})
    (out / "predictions_test.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))


def stage_time(tasks: dict, texts: list[str], raw: Path) -> None:
    """The whole evaluate stage on demo-sized inputs: the demo's three tasks (base = majority, adapted = TF-IDF /
    lexicon predictions standing in for finetune outputs), demo-sized encoders, 300 domain test texts."""
    import contextlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertpipe.core.stage import run_stage, write_json
    from bertpipe.graph.pipeline import family_stages
    from bertpipe.lib.labelled import SPLITS_JSON, write_split

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        work = root / "work"
        base = encoder(root / "base", raw / "bert-base-chinese", 0)
        encoder(work / "pretrain" / "model", raw / "bert-base-chinese", 1)
        (work / "prepare" / "domain").mkdir(parents=True)
        pq.write_table(pa.table({"text": texts}), work / "prepare" / "domain" / "test.parquet")
        for name, (ttype, splits) in tasks.items():
            tdir = work / "splits" / name
            tdir.mkdir(parents=True)
            info = {s: write_split(tdir / f"{s}.jsonl", splits.get(s, [])) for s in ("train", "dev", "test")}
            write_json(tdir / SPLITS_JSON, {"splits": info})
            if ttype == "ner":
                weak, strong = [[] for _ in splits["test"]], [BL.Lexicon.from_train(splits["train"]).match(ex.text)
                                                               for ex in splits["test"]]
            else:
                weak = BL.majority_predictions(splits["train"], splits["test"])
                strong = BL.tfidf_predictions(splits["train"], splits["test"])
            _finetune_dir(work / "finetune" / name / "base", ttype, splits["test"], weak)
            _finetune_dir(work / "finetune" / name / "adapted", ttype, splits["test"], strong)
        tasks_yaml = "".join(f"    {n}: {{type: {t}, format: jsonl, train: x.jsonl}}\n" for n, (t, _) in tasks.items())
        (root / "params.yaml").write_text(f"paths: {{work: work, state: state}}\nmodel: {{base: {base}}}\n"
                                          f"finetune:\n  encoders: [base, adapted]\n  tasks:\n{tasks_yaml}"
                                          "evaluate: {mlm_max_texts: 300, mlm_max_seq_len: 128}\n")
        cfg = load_config(root / "params.yaml")
        t = time.perf_counter()
        res = run_stage(family_stages(cfg, "evaluate")["evaluate"], cfg, tracker_factory=lambda *a: contextlib.nullcontext())
        print(f"evaluate stage on demo-sized inputs: {time.perf_counter() - t:.1f}s "
              f"(load average {os.getloadavg()[0]:.1f})")
        print((res.out / "report.md").read_text().split("## Verdicts")[1].split("Seeds per task")[0].strip())


if __name__ == "__main__":
    main()
