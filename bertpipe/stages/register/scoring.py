"""Scores for the gate that are not in a finetune output: a champion re-scored on today's test set (exported from
the registry, run through the training library's scoring code), per-example predictions kept with each version, and
the paired bootstrap interval of challenger - champion on the same test examples."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bertpipe.lib.measures import bootstrap as B
from bertpipe.stages.register.gate import task_settings

PREDICTIONS_TAG = "bertpipe.predictions"  # "<run id>:<artifact path>" of a version's test predictions


class _AnyLabel(dict):
    """label2id for scoring only: a test label the champion never saw still featurises (its id trains nothing)."""

    def __missing__(self, key):
        return 0


def score_model_dir(cfg, model_dir: Path, ft_dir: Path, task: str) -> tuple[float | None, list[dict]]:
    """(primary test value, prediction records) of a save_pretrained task model on today's test set, with the
    settings the candidate was scored with (so champion and challenger are scored the same way)."""
    from transformers import AutoTokenizer

    from bertpipe.infra.cores import use_training_threads
    from bertpipe.infra.device import pick_device
    from bertpipe.lib.labelled import task_examples
    from bertpipe.lib.measures.metrics import PRIMARY
    from bertpipe.lib.modelinfo import clamp_seq_len
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.heads import auto_class
    from bertpipe.lib.training.predict import score

    tp, trp = task_settings(cfg, ft_dir, task)
    use_training_threads(trp.num_threads)  # the count every door scores with (bertpipe.infra.cores), as finetune's did
    seq_len = clamp_seq_len(trp.max_seq_len, model_dir, "finetune.train.max_seq_len")
    trp = trp.model_copy(update={"max_seq_len": seq_len})
    exs = task_examples(cfg, task, ("test",))["test"]  # today's test split (the splits stage's)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = auto_class(tp.type).from_pretrained(str(model_dir)).to(pick_device(trp.device))
    id2label = getattr(model.config, "id2label", {}) or {}
    labels = [id2label[i] for i in range(len(id2label))] if tp.type != "qa" else []
    split = featurize(tok, exs, tp, trp, _AnyLabel({lab: i for i, lab in enumerate(labels)}), Counter(), "test")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    flat, _, recs = score(model, split, tp, labels, pad, trp.eval_batch_size, False)
    value = flat.get(PRIMARY[tp.type])
    return (float(value) if value is not None else None), recs


def stored_predictions(client, mv, scratch: Path) -> list[dict] | None:
    """The test predictions kept with a registered version, or None when it has none (or they are gone)."""
    ref = (mv.tags or {}).get(PREDICTIONS_TAG, "")
    if ":" not in ref:
        return None
    run_id, artifact = ref.split(":", 1)
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        local = client.download_artifacts(run_id, artifact, str(scratch))
        return B.read_predictions(Path(local)) or None
    except Exception:  # artifact store moved or pruned: the caller re-scores instead
        return None


def paired_interval(task_type: str, champion_recs: list[dict], challenger_recs: list[dict], n: int, seed: int
                    ) -> tuple[tuple[float, float] | None, str]:
    """(95% interval of challenger - champion, note) over the test examples both were scored on, by the evaluate
    stage's paired bootstrap and statistic (``bertpipe.lib.measures.bootstrap``)."""
    gold, challenger, champion = B.shared_examples(task_type, challenger_recs, champion_recs)
    if not gold or len(gold) != len(challenger_recs):
        return None, f"predictions cover different examples ({len(gold)} of {len(challenger_recs)} shared)"
    lo, hi = B.paired_bootstrap(gold, champion, challenger, B.METRIC_FNS[task_type], n, seed)["ci95"]
    return (lo, hi), f"paired bootstrap over {len(gold)} test examples, {n} resamples"
