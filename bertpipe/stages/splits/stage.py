"""The ``splits`` stage: every finetune task's splits, materialised once (see ``bertpipe.lib.labelled`` for the layout).

Per task: read and clean its files (``bertpipe.lib.training.taskfiles``), find near-duplicates among all its examples
(prepare's MinHash and settings), split off the missing dev/test by group with near-duplicate groups merged, drop what
still crosses splits (``bertpipe.stages.splits.leaks``), apply the caps (``max_train_examples``/``max_eval_examples``,
per task ``train_overrides`` included), refuse an empty dev or test split (finetune would score nothing, a nan metric;
see ``empty_split``) and map unknown dev/test labels. The files then hold exactly what finetune trains,
selects and scores on, what prepare removes from the pretraining corpora, and what register identifies a test set by.

The fingerprint covers the task definitions, the two caps and prepare.dedup, not e.g. the finetune learning rate.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bertpipe.core.stage import write_json
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.labelled import SPLITS, SPLITS_JSON, write_split
from bertpipe.lib.training import taskfiles as D
from bertpipe.lib.training.params import TaskParams, TrainParams
from bertpipe.stages.splits.leaks import decontaminate, leak_text, merged_groups, near_pairs

def materialise(task: str, p: TaskParams, shared_train: TrainParams, resolve, dedup, root: Path | None = None):
    """(splits, labels, counts, caps) of one task, exactly as finetune will use them."""
    tp = p.train_params(shared_train)
    p = D.resolved(p, resolve)
    counts: Counter = Counter()
    files = D.read_files(p, resolve, counts)
    pool = [ex for s in SPLITS for ex in files.get(s, [])]
    if root is not None:  # file:line relative to the project, so the split files (and their sha256) travel
        prefix = str(root).rstrip("/") + "/"
        for ex in pool:
            if ex.where.startswith(prefix):
                ex.where = ex.where[len(prefix):]
    index = {id(ex): i for i, ex in enumerate(pool)}
    pairs = near_pairs([leak_text(ex) for ex in pool], dedup)
    keys = merged_groups(pool, pairs)
    key_of = {id(ex): k for ex, k in zip(pool, keys)}
    to_split = files.get("train", [])
    counts["near_dup_pairs"] = len(pairs)
    counts["groups"] = len({D.own_group(ex) for ex in to_split})
    counts["groups_after_merge"] = len({key_of[id(ex)] for ex in to_split})
    data = D.split_missing(files, p, counts, key=lambda ex: key_of[id(ex)])
    data = decontaminate(data, index, pairs, counts)
    caps = {"train": tp.max_train_examples, "dev": tp.max_eval_examples, "test": tp.max_eval_examples}
    for s in SPLITS:
        counts[f"{s}_available"] = len(data[s])
        data[s] = D.cap(data[s], caps[s], p.split_seed)
        counts[f"{s}_examples"] = len(data[s])
    if not data["train"]:
        raise BertpipeError(f"finetune.tasks.{task}: no training examples left after near-duplicate removal")
    for s in ("dev", "test"):
        if not data[s] and not (s == "dev" and "dev" not in files and p.dev_ratio == 0):
            raise BertpipeError(empty_split(task, p, s, files, lambda ex: key_of[id(ex)]))
    labels = D.label_list(p, data, counts)  # maps unseen dev/test labels (unknown_label: map) in place
    return data, labels, counts, caps


def empty_split(task: str, p: TaskParams, split: str, files: dict, key) -> str:
    """Why ``split`` of a task holds no example (finetune would score nothing: a nan metric), and what to change.
    Only dev may be empty, and only when asked for (``dev_ratio: 0`` without a dev file: no seed selection)."""
    where = f"finetune.tasks.{task}"
    if split in files:
        return (f"{where}.{split}: {getattr(p, split)}: no {split} example left after cleaning and near-duplicate "
                "removal (finetune would score nothing)")
    ratio = getattr(p, f"{split}_ratio")
    if ratio == 0:
        return f"{where}: no {split} file and {split}_ratio is 0; a task needs {split} examples to be scored"
    total, few = D.thin_strata(files.get("train", []), key)
    if few:
        return (f"{where}: the {split} split is empty: it is split off train stratified by label, and {few:,} of "
                f"the {total:,} labels have fewer than 3 examples (a label's only examples stay in train); give a "
                f"{split} file, or fewer labels with more examples each")
    return (f"{where}: the {split} split is empty: nothing of train could go to it ({split}_ratio {ratio}, after "
            f"near-duplicate removal); give a {split} file or more training examples")


def build(ctx) -> dict:
    fp = ctx.params  # the finetune section: its tasks and the shared train params the caps come from
    dedup = ctx.cfg.params.prepare.dedup
    metrics: dict = {}
    lines = ["# splits", "", "| task | type | train | dev | test | near-dup pairs | groups merged | "
             "dropped (train/dev) |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for task, p in fp.tasks.items():
        data, labels, counts, caps = materialise(task, p, fp.train, ctx.cfg.path, dedup, ctx.cfg.root)
        tdir = ctx.out / task
        tdir.mkdir(parents=True)
        splits = {s: write_split(tdir / f"{s}.jsonl", data[s]) for s in SPLITS}
        info = {"task": task, "type": p.type, "splits": splits, "labels": labels, "caps": caps,
                "counts": dict(sorted(counts.items()))}
        if p.type == "ner":
            info["entity_types"] = sorted({t for ex in data["train"] for *_, t in ex.spans})
        write_json(tdir / SPLITS_JSON, info)
        merged = counts["groups"] - counts["groups_after_merge"]
        ctx.log(f"{task}: " + ", ".join(f"{s} {splits[s]['examples']}" for s in SPLITS)
                + f" ({counts['near_dup_pairs']} near-duplicate pairs, {merged} groups merged)")
        lines.append(f"| {task} | {p.type} | " + " | ".join(f"{splits[s]['examples']:,}" for s in SPLITS)
                     + f" | {counts['near_dup_pairs']:,} | {merged:,} | "
                     f"{counts['train_near_dup_dropped']:,}/{counts['dev_near_dup_dropped']:,} |")
        for s in SPLITS:
            metrics[f"{task}_{s}_examples"] = splits[s]["examples"]
        metrics[f"{task}_near_dup_dropped"] = counts["train_near_dup_dropped"] + counts["dev_near_dup_dropped"]
        ctx.counts[task] = {s: splits[s]["examples"] for s in SPLITS}
    lines += ["", "Near-duplicates: prepare.dedup's MinHash over each task's texts. Groups sharing near-duplicates in "
              "a good part of their examples are split together; an example still near-duplicating one in a more "
              "precious split (train < dev < test) is dropped. Caps apply after that."]
    (ctx.out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ctx.log_artifact(ctx.out / "report.md")
    return metrics
