"""Task data: readers for jsonl/csv/tsv/CoNLL/SQuAD/sqlite/lines files, cleaning, deterministic splits, label sets.

Every example remembers where it came from (``file:line``) so bad input is reported where a person can fix it.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

from bertpipe.infra.errors import BertpipeError, utf8_error
from bertpipe.infra.sqlite_io import reading
from bertpipe.lib.labelled import Example
from bertpipe.lib.training import tagging
from bertpipe.lib.training.fields import (disjoint as _disjoint, get as _get, label as _label,
                                          scalar_text as _scalar_text, text as _text)
from bertpipe.lib.training.params import TaskParams

SPLITS = ("train", "dev", "test")


def _h(*parts: Any) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()


def _warn(msg: str) -> None:
    print(f"[finetune] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- record readers: (where, dict)


def _open_text(path: Path):
    try:
        return open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise BertpipeError(f"{path}: cannot read ({e.strerror})") from None


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    with _open_text(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise BertpipeError(f"{path}:{i}: expected one JSON object per line ({e.msg})") from None
            if not isinstance(rec, dict):
                raise BertpipeError(f"{path}:{i}: expected a JSON object")
            yield f"{path}:{i}", rec


def read_csv(path: Path, delimiter: str) -> Iterator[tuple[str, dict]]:
    with _open_text(path) as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        for rec in reader:
            yield f"{path}:{reader.line_num}", rec


def read_sqlite(path: Path, query: str) -> Iterator[tuple[str, dict]]:
    with reading(path) as con:
        cur = con.execute(query)
        names = [d[0] for d in cur.description]
        for i, row in enumerate(cur, 1):
            yield f"{path}:row{i}", dict(zip(names, row))


# ---------------------------------------------------------------- per task type


def _classification(records: Iterator[tuple[str, dict]], p: TaskParams, prefix: str) -> Iterator[Example]:
    for n, (where, rec) in enumerate(records):
        ex_id = _text(rec, p.id_field, where, required=False)
        yield Example(
            id=f"{prefix}{ex_id if ex_id is not None else n}",
            text=_text(rec, p.text_field, where),
            text_pair=_text(rec, p.text_pair_field, where) if p.type == "pair_classification" else None,
            label=_label(rec, p.label_field, where),
            group=_text(rec, p.group_field, where) if p.group_field else None,
            where=where,
        )


def read_lines(label_files: dict[str, Path]) -> Iterator[Example]:
    for label, path in label_files.items():
        with _open_text(path) as f:
            try:
                for i, line in enumerate(f, 1):
                    yield Example(id=f"{label}:{i}", text=line.rstrip("\r\n"), label=label, where=f"{path}:{i}")
            except UnicodeDecodeError as e:
                raise utf8_error(path, e) from None


def read_conll(path: Path, p: TaskParams, counts: Counter) -> Iterator[Example]:
    """Token-per-line files, blank line between sentences (CRLF tolerated); tags converted to character spans.

    Reads whole sentences at a time: MSRA's 2.2M lines are mostly string splitting done in C.
    """
    with _open_text(path) as f:
        content = f.read()
    ncols = p.conll_columns or None
    repair = p.invalid_tags == "repair"
    lines = content.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i, n = 0, len(lines)
    while i < n:
        if not lines[i].strip():
            i += 1
            continue
        j = i
        while j < n and lines[j].strip():
            j += 1
        rows = [ln.split() for ln in lines[i:j]]
        if ncols is None:
            ncols = len(rows[0])
        if ncols < 2 or any(len(r) != ncols for r in rows):
            k = next(k for k, r in enumerate(rows) if len(r) != ncols or ncols < 2)
            raise BertpipeError(f"{path}:{i + k + 1}: expected {max(ncols, 2)} whitespace-separated columns, "
                                f"got {len(rows[k])}")
        if max(p.conll_token_col, p.conll_tag_col if p.conll_tag_col >= 0 else -p.conll_tag_col - 1) >= ncols:
            raise BertpipeError(f"{path}:{i + 1}: conll_token_col {p.conll_token_col} / conll_tag_col "
                                f"{p.conll_tag_col} point beyond the {ncols} columns of this file")
        tokens = [r[p.conll_token_col] for r in rows]
        tags = [r[p.conll_tag_col] for r in rows]
        try:
            tok_spans, repaired = tagging.tags_to_spans(tags, p.tag_scheme, repair=repair)
        except tagging.TagError as e:
            raise BertpipeError(f"{path}:{i + e.index + 1}: {e.message}") from None
        counts["tags_repaired"] += repaired
        text, units = tagging.join_tokens(tokens, p.conll_join)
        spans = [(units[a][0], units[b - 1][1], t) for a, b, t in tok_spans]
        yield Example(id=f"{path.name}:{i + 1}", text=text, units=units, spans=spans, where=f"{path}:{i + 1}")
        i = j


def _ner_jsonl(path: Path, p: TaskParams, counts: Counter) -> Iterator[Example]:
    for n, (where, rec) in enumerate(read_jsonl(path)):
        ex_id = f"{path.name}:{_text(rec, p.id_field, where, required=False) or n}"
        if p.spans_field in rec:
            text = _text(rec, p.text_field, where)
            spans = []
            for s in rec[p.spans_field] or []:
                try:
                    a, b, t = int(s["start"]), int(s["end"]), _scalar_text(s["label"], where, "a span's label")
                except (KeyError, TypeError, ValueError):
                    raise BertpipeError(f"{where}: each span needs integer start, end and a label") from None
                if not (0 <= a < b <= len(text)):
                    raise BertpipeError(f"{where}: span {a}..{b} outside the text (length {len(text)})")
                spans.append((a, b, t))
            yield Example(id=ex_id, text=text, spans=_disjoint(spans, where), units=[], where=where)
            continue
        toks, tags = _get(rec, p.tokens_field, where), _get(rec, p.tags_field, where)
        if not isinstance(toks, list) or not isinstance(tags, list):
            raise BertpipeError(f"{where}: fields {p.tokens_field!r} and {p.tags_field!r} must be lists")
        toks = [_scalar_text(t, where, f"a token of {p.tokens_field!r}") for t in toks]
        if len(toks) != len(tags):
            raise BertpipeError(f"{where}: {len(toks)} tokens but {len(tags)} tags")
        try:
            tok_spans, repaired = tagging.tags_to_spans(tags, p.tag_scheme, repair=p.invalid_tags == "repair")
        except tagging.TagError as e:
            raise BertpipeError(f"{where}: token {e.index}: {e.message}") from None
        counts["tags_repaired"] += repaired
        text, units = tagging.join_tokens(toks, p.conll_join)
        spans = [(units[s][0], units[e - 1][1], t) for s, e, t in tok_spans]
        yield Example(id=ex_id, text=text, units=units, spans=spans, where=where)


def read_squad(path: Path, counts: Counter) -> Iterator[Example]:
    """SQuAD v1/v2, CMRC 2018 and DuReader-robust JSON.

    Layout: data[].paragraphs[].{context, qas[].{id, question, answers[].{text, answer_start}}}.
    """
    try:
        with _open_text(path) as f:
            doc = json.load(f)
    except ValueError as e:
        raise BertpipeError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise BertpipeError(f"{path}: expected SQuAD format, a JSON object with a 'data' list")
    for i, art in enumerate(doc["data"]):
        for j, para in enumerate(art.get("paragraphs", [])):
            ctx = para.get("context")
            if not isinstance(ctx, str):
                raise BertpipeError(f"{path}: data[{i}].paragraphs[{j}]: missing 'context'")
            for k, qa in enumerate(para.get("qas", [])):
                where = f"{path}: data[{i}].paragraphs[{j}].qas[{k}] (id {qa.get('id')})"
                if "question" not in qa:
                    raise BertpipeError(f"{where}: missing 'question'")
                answers = []
                for a in qa.get("answers", []):
                    text = _scalar_text(a.get("text", ""), where, "an answer's 'text'")
                    start = a.get("answer_start", -1)
                    if not text:
                        continue
                    if not (isinstance(start, int) and ctx[start : start + len(text)] == text):
                        found = ctx.find(text)
                        if found < 0:
                            raise BertpipeError(f"{where}: answer {text!r} is not in its context")
                        counts["answer_start_fixed"] += 1
                        start = found
                    answers.append((text, start))
                yield Example(
                    id=str(qa.get("id", f"{i}-{j}-{k}")), text=ctx,
                    question=_scalar_text(qa["question"], where, "'question'"), answers=answers,
                    where=where,
                )


# ---------------------------------------------------------------- loading, cleaning, splitting


def _read_file(path: Path, p: TaskParams, counts: Counter, prefix: str) -> list[Example]:
    try:
        return _read_any(path, p, counts, prefix)
    except UnicodeDecodeError as e:  # GB18030, UTF-16 or a binary file: say which file and line
        raise utf8_error(path, e) from None


def _read_any(path: Path, p: TaskParams, counts: Counter, prefix: str) -> list[Example]:
    if p.type == "qa":
        return list(read_squad(path, counts))
    if p.type == "ner":
        return list(read_conll(path, p, counts) if p.format == "conll" else _ner_jsonl(path, p, counts))
    readers: dict[str, Callable[[], Iterator[tuple[str, dict]]]] = {
        "jsonl": lambda: read_jsonl(path),
        "csv": lambda: read_csv(path, ","),
        "tsv": lambda: read_csv(path, "\t"),
        "sqlite": lambda: read_sqlite(path, p.query),
    }
    if p.format not in readers:
        raise BertpipeError(f"format {p.format} cannot hold {p.type} data (use jsonl, csv, tsv or sqlite)")
    return list(_classification(readers[p.format](), p, prefix))


def _clean(exs: list[Example], p: TaskParams, counts: Counter, split: str) -> list[Example]:
    out = []
    for ex in exs:
        if len(ex.text.strip()) < p.min_chars or (ex.text_pair is not None and len(ex.text_pair.strip()) < p.min_chars):
            if counts[f"{split}_empty_dropped"] == 0:
                _warn(f"{ex.where}: empty or too short text (min_chars {p.min_chars}); dropping such records")
            counts[f"{split}_empty_dropped"] += 1
            continue
        out.append(ex)
    if p.type in ("classification", "pair_classification") and (p.dedup or p.drop_conflicts):
        labels: dict[tuple, set] = defaultdict(set)
        for ex in out:
            labels[(ex.text.strip(), ex.text_pair)].add(ex.label)
        seen: set = set()
        kept = []
        for ex in out:
            key = (ex.text.strip(), ex.text_pair)
            if p.drop_conflicts and len(labels[key]) > 1:
                counts[f"{split}_conflicts_dropped"] += 1
                continue
            if p.dedup and (key, ex.label) in seen:
                counts[f"{split}_duplicates_dropped"] += 1
                continue
            seen.add((key, ex.label))
            kept.append(ex)
        out = kept
    return out


def _take(n: float, ratio: float) -> int:
    """How many groups of a stratum of ``n`` go to a split of ``ratio``: at least one once the stratum has three."""
    if ratio <= 0:
        return 0
    k = round(n * ratio)
    return max(k, 1) if n >= 3 else k


def own_group(ex: Example) -> str:
    """The leakage group of an example: its group field, or the example alone."""
    return ex.group if ex.group is not None else f"\x00{ex.id}"


def group_split(
    exs: list[Example], dev_ratio: float, test_ratio: float, seed: int, key: Callable[[Example], str] = own_group
) -> dict[str, list[Example]]:
    """Deterministic split that keeps every group (``key``) whole, stratified by each group's majority label.

    A group's place depends only on its own name and the seed (a hash order), so adding data moves few groups.
    """
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in exs:
        groups[key(ex)].append(ex)
    strata: dict[str, list[str]] = defaultdict(list)
    for g, members in groups.items():
        strata[Counter(m.label or "" for m in members).most_common(1)[0][0]].append(g)
    where: dict[str, str] = {}
    for label in sorted(strata):
        gs = sorted(strata[label], key=lambda g: _h(seed, g))
        n_test, n_dev = _take(len(gs), test_ratio), _take(len(gs), dev_ratio)
        if n_test + n_dev >= len(gs):  # keep at least one group to learn the label from
            n_test, n_dev = min(n_test, max(len(gs) - 1, 0)), 0
        for i, g in enumerate(gs):
            where[g] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    out: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for g, members in groups.items():
        out[where[g]].extend(members)
    return out


def thin_strata(exs: list[Example], key: Callable[[Example], str] = own_group) -> tuple[int, int]:
    """(strata, strata too small to give a split a group) of ``group_split``'s stratification of ``exs``."""
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in exs:
        groups[key(ex)].append(ex)
    sizes = Counter(Counter(m.label or "" for m in members).most_common(1)[0][0] for members in groups.values())
    return len(sizes), sum(n < 3 for n in sizes.values())


def cap(exs: list[Example], n: int, seed: int) -> list[Example]:
    """A deterministic sample of ``n`` examples (all when n is 0), in their original order."""
    if not n or len(exs) <= n:
        return exs
    keep = set(sorted(range(len(exs)), key=lambda i: _h(seed, exs[i].id, i))[:n])
    return [ex for i, ex in enumerate(exs) if i in keep]


def _unique_ids(exs: list[Example], prefix: str) -> None:
    """An id names one example: rows sharing one would silently become one leakage group (and one prediction id)."""
    first: dict[str, Example] = {}
    for ex in exs:
        seen = first.setdefault(ex.id, ex)
        if seen is not ex:
            raise BertpipeError(f"{ex.where}: id {ex.id.removeprefix(prefix)!r} repeats the id of {seen.where}; give "
                                "every example its own id (group_field keeps related rows in one split)")


def _one_spelling_per_number(files: dict[str, list[Example]]) -> None:
    """Label texts that read as one number ("1", "1.0", "01") are one class spelled two ways: an error, not two
    classes (``fields.label`` spells JSON and SQLite numbers one way already)."""
    spelling: dict[float, Example] = {}
    for ex in (ex for exs in files.values() for ex in exs):
        try:
            number = float(ex.label or "")
        except ValueError:
            continue
        seen = spelling.setdefault(number, ex)
        if seen.label != ex.label and math.isfinite(number):
            raise BertpipeError(f"{ex.where}: label {ex.label!r} is the number of label {seen.label!r} "
                                f"({seen.where}); spell each label one way so that they are one class")


def resolved(p: TaskParams, resolve: Callable[[str], Path]) -> TaskParams:
    """``p`` with its file names resolved (``{raw}`` expanded), as every message about them names them."""
    names = {s: str(resolve(getattr(p, s))) for s in SPLITS if getattr(p, s)}
    return p.model_copy(update={**names, "label_files": {k: str(resolve(v)) for k, v in p.label_files.items()}})


def read_files(p: TaskParams, resolve: Callable[[str], Path], counts: Counter) -> dict[str, list[Example]]:
    """Read and clean the files a task names: {split: examples} for the splits that have a file."""
    files: dict[str, list[Example]] = {}
    if p.format == "lines":
        files["train"] = list(read_lines({k: resolve(v) for k, v in p.label_files.items()}))
    else:
        for split in SPLITS:
            name = getattr(p, split)
            if name:
                files[split] = _read_file(resolve(name), p, counts, prefix=f"{split}:")
                _unique_ids(files[split], f"{split}:")
    if p.type in ("classification", "pair_classification"):
        _one_spelling_per_number(files)
    return {s: _clean(exs, p, counts, s) for s, exs in files.items()}


def split_missing(
    files: dict[str, list[Example]], p: TaskParams, counts: Counter, key: Callable[[Example], str] = own_group
) -> dict[str, list[Example]]:
    """{train, dev, test}: the splits without a file are split off train by group (``key``)."""
    data = {s: files.get(s, []) for s in SPLITS}
    missing = [s for s in ("dev", "test") if s not in files]
    if missing:
        ratios = {"dev": p.dev_ratio if "dev" in missing else 0.0, "test": p.test_ratio if "test" in missing else 0.0}
        parts = group_split(files["train"], ratios["dev"], ratios["test"], p.split_seed, key)
        data["train"] = parts["train"]
        for s in missing:
            data[s] = parts[s]
    if not data["train"]:
        raise BertpipeError(f"{p.train or list(p.label_files.values())}: no training examples left after cleaning")
    for s in SPLITS:
        counts[f"{s}_examples"] = len(data[s])
    return data


def label_list(p: TaskParams, data: dict[str, list[Example]], counts: Counter) -> list[str]:
    """The label set, inferred from train; dev/test labels unseen in train raise or map to ``unknown_label_name``."""
    if p.type == "qa":
        return []
    if p.type == "ner":
        seen = sorted({t for ex in data["train"] for *_, t in ex.spans})
    else:
        seen = sorted({ex.label for ex in data["train"]})
    known = set(seen)
    for split in ("dev", "test"):
        for ex in data[split]:
            if p.type == "ner":
                bad = [t for *_, t in ex.spans if t not in known]
            else:
                bad = [ex.label] if ex.label not in known else []
            if not bad:
                continue
            if p.unknown_label == "error":
                raise BertpipeError(f"{ex.where}: label {bad[0]!r} does not occur in train (set unknown_label: map)")
            counts[f"{split}_unknown_labels"] += len(bad)
            if p.type == "ner":
                ex.spans = [(a, b, t if t in known else p.unknown_label_name) for a, b, t in ex.spans]
            else:
                ex.label = p.unknown_label_name
            if p.unknown_label_name not in seen:
                seen.append(p.unknown_label_name)
    if p.type == "ner":
        return tagging.label_names(seen, p.model_scheme)
    if len(seen) < 2:
        where = p.train or p.label_files
        raise BertpipeError(f"{where}: classification needs at least two labels in train, got {seen}")
    return seen
