"""Scores for the gate that are not in a finetune output: a champion re-scored on today's test set (exported from
the registry, run through the training library's scoring code), per-example predictions kept with each version, and
the paired bootstrap interval of challenger - champion on the same test examples."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bertpipe.stages.register.gate import task_settings

PREDICTIONS = "predictions_test.jsonl"
PREDICTIONS_TAG = "bertpipe.predictions"  # "<run id>:<artifact path>" of a version's test predictions


class _AnyLabel(dict):
    """label2id for scoring only: a test label the champion never saw still featurises (its id trains nothing)."""

    def __missing__(self, key):
        return 0


def test_examples(cfg, ft_dir: Path, task: str) -> list:
    """Today's test examples of ``task``: the splits stage's materialised test split (``bertpipe.lib.labelled``)."""
    from bertpipe.lib.labelled import task_examples

    return task_examples(cfg, task, ("test",))["test"]


def score_model_dir(cfg, model_dir: Path, ft_dir: Path, task: str) -> tuple[float | None, list[dict]]:
    """(primary test value, prediction records) of a save_pretrained task model on today's test set, with the
    settings the candidate was scored with (so champion and challenger are scored the same way)."""
    from transformers import AutoTokenizer

    from bertpipe.infra.device import pick_device
    from bertpipe.lib.measures.metrics import PRIMARY
    from bertpipe.lib.modelinfo import clamp_seq_len
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.heads import auto_class
    from bertpipe.lib.training.predict import score

    from bertpipe.infra.cores import use_training_threads

    tp, trp = task_settings(cfg, ft_dir, task)
    use_training_threads(trp.num_threads)  # the count every door scores with (bertpipe.infra.cores), as finetune's did
    seq_len = clamp_seq_len(trp.max_seq_len, model_dir, "finetune.train.max_seq_len")
    trp = trp.model_copy(update={"max_seq_len": seq_len})
    exs = test_examples(cfg, ft_dir, task)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = auto_class(tp.type).from_pretrained(str(model_dir)).to(pick_device(trp.device))
    id2label = getattr(model.config, "id2label", {}) or {}
    labels = [id2label[i] for i in range(len(id2label))] if tp.type != "qa" else []
    split = featurize(tok, exs, tp, trp, _AnyLabel({lab: i for i, lab in enumerate(labels)}), Counter(), "test")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    flat, _, recs = score(model, split, tp, labels, pad, trp.eval_batch_size, False)
    value = flat.get(PRIMARY[tp.type])
    return (float(value) if value is not None else None), recs


def read_predictions(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def stored_predictions(client, mv, scratch: Path) -> list[dict] | None:
    """The test predictions kept with a registered version, or None when it has none (or they are gone)."""
    ref = (mv.tags or {}).get(PREDICTIONS_TAG, "")
    if ":" not in ref:
        return None
    run_id, artifact = ref.split(":", 1)
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        local = client.download_artifacts(run_id, artifact, str(scratch))
        return read_predictions(Path(local))
    except Exception:  # artifact store moved or pruned: the caller re-scores instead
        return None


def _gold_pred(task_type: str, rec: dict):
    if task_type == "ner":
        return (tuple(tuple(s[:3]) for s in rec["gold"]), tuple(tuple(s[:3]) for s in rec["pred"]))
    return rec.get("label"), rec.get("pred")


def metric_fn(task_type: str, primary: str):
    """metric(gold, pred) over example lists, the bootstrap's statistic; None where the gate has none (QA)."""
    if task_type in ("classification", "pair_classification"):
        from bertpipe.lib.measures.bootstrap import macro_f1
        from bertpipe.lib.measures.metrics import classification_metrics

        if primary == "macro_f1":
            # The evaluate stage's statistic (checked against scikit-learn's): a thousand replicates of the full
            # scikit-learn report took ~50 ms each, most of register's time on a tiny chain.
            return macro_f1

        def cls(gold, pred):
            return classification_metrics(list(gold), list(pred), sorted(set(gold) | set(pred)))[0][primary]

        return cls
    if task_type == "ner":
        def span_f1(gold, pred):  # exact-span micro F1 (the entity F1 of the predictions files)
            g = {(i, *s) for i, spans in enumerate(gold) for s in spans}
            p = {(i, *s) for i, spans in enumerate(pred) for s in spans}
            tp = len(g & p)
            return 2 * tp / (len(g) + len(p)) if g or p else 1.0

        return span_f1
    return None


def _as_interval(res) -> tuple[float, float]:
    if isinstance(res, dict):
        for key in ("ci95", "ci", "interval"):
            if key in res:
                return float(res[key][0]), float(res[key][1])
        return float(res.get("lo", res.get("low"))), float(res.get("hi", res.get("high")))
    seq = list(res)
    return float(seq[-2]), float(seq[-1])


def paired_interval(task_type: str, primary: str, champion_recs: list[dict], challenger_recs: list[dict],
                    n: int, seed: int) -> tuple[tuple[float, float] | None, str]:
    """(95% interval of challenger - champion, note) over the test examples both were scored on."""
    fn = metric_fn(task_type, primary)
    if fn is None:
        return None, f"no per-example statistic for {task_type}"
    champ = {str(r["id"]): r for r in champion_recs}
    pairs = [(r, champ[str(r["id"])]) for r in challenger_recs if str(r["id"]) in champ]
    if not pairs or len(pairs) != len(challenger_recs):
        return None, f"predictions cover different examples ({len(pairs)} of {len(challenger_recs)} shared)"
    try:
        from bertpipe.lib.measures.bootstrap import paired_bootstrap
    except ImportError:
        return None, "bertpipe.lib.measures.bootstrap is not available"
    gold = [_gold_pred(task_type, b)[0] for b, _ in pairs]
    pred_b = [_gold_pred(task_type, b)[1] for b, _ in pairs]
    pred_a = [_gold_pred(task_type, a)[1] for _, a in pairs]
    lo, hi = _as_interval(paired_bootstrap(gold, pred_a, pred_b, fn, n, seed))
    point = fn(gold, pred_b) - fn(gold, pred_a)
    if not lo <= point <= hi and -hi <= point <= -lo:  # an implementation that reports a - b: turn it around
        lo, hi = -hi, -lo
    return (lo, hi), f"paired bootstrap over {len(pairs)} test examples, {n} resamples"
