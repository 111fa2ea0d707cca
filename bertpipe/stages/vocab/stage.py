"""The vocab stage: mine domain words, extend the starting encoder's tokenizer, resize the model and initialise the
new rows. The starting encoder is the base, or on a retrain the champion (``bertpipe.lib.lineage``): its ids never move.

Output (``ctx.out``): ``tokenizer/``, ``model/`` (model + the same tokenizer, loadable with the Auto classes alone),
``added_tokens.tsv``, ``report.md``, ``vocab.png``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families
from bertpipe.lib.corpusio import iter_text_batches, read_texts, split_rows
from bertpipe.stages.vocab import embeddings, extend, mining, report

# Texts held in memory: train for the MLM-head fit, valid for the init comparison and the tokenizer stats (every
# text of the bundled corpora's splits); mining streams the whole train split.
HEAD_TEXTS = 50_000


def _glossaries(ctx) -> list[mining.GlossaryTerm]:
    terms = []
    for key in sorted(k for k in ctx.inputs if k.startswith("glossary:")):
        terms += mining.read_glossary(Path(ctx.inputs[key]))
    return terms


@dataclass
class _Extension:
    """The starting encoder's tokenizer, the extended one, what was mined for it and the ids it added."""

    base_tok: Any
    ext_tok: Any
    mined: mining.MiningResult
    new_ids: list[int]


def build(ctx) -> dict:
    from bertpipe.lib import startrecord as S

    p = ctx.params
    torch.manual_seed(p.seed)
    start, described = _start(ctx)
    glossary = _glossaries(ctx)
    corpus = ctx.inputs["corpus"]
    train = read_texts(corpus, "train", limit=HEAD_TEXTS)
    valid = read_texts(corpus, "valid", limit=HEAD_TEXTS)
    if not train:
        raise BertpipeError(f"{corpus}/train: no non-empty 'text' rows to mine")
    ext = _extend(ctx, described, glossary)
    model, max_length, head_note = _start_model(ctx, ext.base_tok, train)
    losses, (chosen, why), init_stats = _init_new_rows(ctx, model, ext, valid, max_length)
    model.config.update({S.KEY: S.lineage_record(start)})
    _save(ctx, model, ext, losses, chosen)
    ctx.log(f"measuring the tokenizers on {len(valid)} valid texts")
    before, after = extend.compare_tokenizers(ext.base_tok, ext.ext_tok, valid or train[:1000])
    rows = _rows(ext.ext_tok, ext.base_tok, ext.mined, ext.new_ids)
    _report(ctx, ext, rows, glossary, described, before, after, losses, (chosen, why), head_note)
    ctx.counts.update({
        "train_texts": split_rows(corpus, "train"), "valid_texts": len(valid), "start_vocab_size": len(ext.base_tok),
        "added_tokens": len(ext.new_ids), "added_words": sum(r["kind"] != "unk_char" for r in rows),
        "added_unk_chars": sum(r["kind"] == "unk_char" for r in rows), "glossary_terms": len(glossary),
        "candidates": ext.mined.n_candidates, "vocab_size": len(ext.ext_tok),
        "embedding_rows": int(init_stats.get("rows", len(ext.ext_tok))),
    })
    metrics = _metrics(ext, before, after, losses)
    ctx.log_metrics(metrics)
    ctx.log(
        f"tokens/char {before['tokens_per_char']:.4f} -> {after['tokens_per_char']:.4f}, "
        f"UNK chars/char {before['unk_rate']:.2e} -> {after['unk_rate']:.2e}, speed {metrics['speed_ratio']:.2f}x"
    )
    # Strings go to the manifest only (MLflow metrics are numbers).
    return {**metrics, "init": chosen, "init_reason": why, "start": described}


def _start(ctx) -> tuple[dict, str]:
    """The start stage's decision (the model and tokenizer inputs follow it) and its description."""
    from bertpipe.lib import startrecord as S
    from bertpipe.lib.layout import read_start

    start = read_start(ctx.inputs["start"])
    if start is None:
        raise BertpipeError(f"{ctx.inputs['start']}: not a start decision (run `bertpipe start` first)")
    described = S.describe(start, ctx.inputs["model"])
    ctx.log(f"extending {described}")
    return start, described


def _extend(ctx, described: str, glossary: list[mining.GlossaryTerm]) -> _Extension:
    """The starting tokenizer extended with the words mined from the train split (and the characters it reads as
    [UNK]), after every existing id: an extension that would move an existing id is an error."""
    p, corpus = ctx.params, ctx.inputs["corpus"]
    base_tok = extend.load_tokenizer(ctx.inputs["tokenizer"])
    workers = mining.count.workers_budget()
    ctx.log(f"mining {split_rows(corpus, 'train')} train texts with jieba (HMM {'on' if p.hmm else 'off'}, "
            f"{workers} worker(s))")
    # Mined against the starting tokenizer: words it already has (a champion's earlier additions) are one piece
    # and never candidates again, so only new words are added, after every existing id.
    mined = mining.mine_batches(iter_text_batches(corpus, "train"), base_tok, ctx.cfg.params.model.language, p,
                                glossary, workers=workers, total_bytes=_text_bytes(corpus, "train"))
    if mined.undercount:
        ctx.log(f"mining kept the {mining.count.MAX_WORDS // 2} most frequent distinct words: frequencies may be "
                f"low by at most {mined.undercount}")
    forms = [f for f, _ in mined.unk_forms]
    ext_tok = extend.extend_tokenizer(base_tok, [c.word for c in mined.candidates], forms)
    new_ids = extend.new_token_ids(base_tok, ext_tok)
    moved = extend.moved_ids(base_tok, ext_tok)
    if moved:  # a model finetuned on the starting encoder would read other ids for these: never ship that
        raise BertpipeError(f"vocab: extending {described} moved {len(moved)} existing ids (e.g. {moved[0]!r})")
    ctx.log(f"added {len(new_ids)} ids ({len(mined.candidates)} words, {len(forms)} [UNK]-character forms)")
    return _Extension(base_tok, ext_tok, mined, new_ids)


def _start_model(ctx, base_tok, train: list[str]) -> tuple[Any, int, str]:
    """(the starting encoder with its MLM head, the scoring length, what happened to the head): a head the
    checkpoint lacks is initialised fresh and fitted on the train split with the encoder frozen."""
    from bertpipe.lib.modelinfo import clamp_seq_len

    p = ctx.params
    model, head_missing = embeddings.load_mlm(ctx.inputs["model"], log=ctx.log)
    max_length = clamp_seq_len(p.eval_max_length, model, "vocab.eval_max_length", ctx.log)
    head_note = "loaded from the checkpoint"
    if head_missing:
        head_note = "absent from the checkpoint: initialised fresh"
        if p.head_fit_steps > 0:
            last = embeddings.fit_head(model, base_tok, train, p.head_fit_steps, max_length=max_length, seed=p.seed,
                                       log=ctx.log)
            head_note += f", then fitted {p.head_fit_steps} steps on the train split, encoder frozen (loss {last:.3f})"
    ctx.log(f"MLM head {head_note}")
    return model, max_length, head_note


def _init_new_rows(ctx, model, ext: _Extension, valid: list[str], max_length: int
                   ) -> tuple[dict[str, float], tuple[str, str], dict]:
    """The new rows initialised the way that predicts held-out text best (each candidate scored on the same masked
    positions): (held-out MLM losses, (chosen init, why), what the resize did)."""
    p = ctx.params
    eval_texts = valid[: p.eval_texts]
    kw = dict(max_length=max_length, seed=p.seed)
    losses: dict[str, float] = {}
    if eval_texts:
        losses["start (its own tokenizer)"] = embeddings.mlm_loss(model, ext.base_tok, eval_texts, **kw)
    scored = embeddings.compare_inits(model, ext.base_tok, ext.ext_tok, eval_texts, embeddings.INITS, **kw) \
        if eval_texts and ext.new_ids else {}
    losses.update({f"{m} init": v for m, v in scored.items()})
    chosen, why = embeddings.choose_init(p.init, scored)
    ctx.log(f"init of the {len(ext.new_ids)} new rows: {chosen} ({why})")
    init_stats = embeddings.extend_model(model, ext.base_tok, ext.ext_tok, chosen, seed=p.seed)
    return losses, (chosen, why), init_stats


def _save(ctx, model, ext: _Extension, losses: dict[str, float], chosen: str) -> None:
    """``tokenizer/`` and ``model/`` (the model with the same tokenizer and its card)."""
    from bertpipe.lib import modelcard

    out = Path(ctx.out)
    ext.ext_tok.save_pretrained(out / "tokenizer")
    model.save_pretrained(out / "model")
    ext.ext_tok.save_pretrained(out / "model")
    modelcard.write(out / "model", ctx, pipeline_tag="fill-mask", base_model=str(ctx.inputs.get("model") or ""),
                    metrics={f"mlm_loss {k}": v for k, v in losses.items()},
                    notes=f"The base encoder with {len(ext.new_ids)} domain words added to its vocabulary "
                          f"({chosen} init).")


def _report(ctx, ext: _Extension, rows: list[dict], glossary: list[mining.GlossaryTerm], described: str,
            before: dict, after: dict, losses: dict[str, float], init: tuple[str, str], head_note: str) -> None:
    """``added_tokens.tsv``, ``report.md`` and ``vocab.png``, logged as artifacts."""
    out = Path(ctx.out)
    report.write_added_tokens(out / "added_tokens.tsv", rows)
    report.write_report(
        out / "report.md",
        language=ctx.cfg.params.model.language,
        base_src=str(ctx.inputs["tokenizer"]),
        model_src=str(ctx.inputs["model"]),
        start=described,
        mining=ext.mined,
        rows=rows,
        before=before,
        after=after,
        losses=losses,
        init=init,
        glossary_rows=_glossary_rows(glossary, ext.base_tok, ext.ext_tok, ext.mined),
        head_note=head_note,
        params=ctx.cfg.section_dict("vocab"),
    )
    if report.write_figure(out / "vocab.png", before, after, losses):
        ctx.log_artifact(out / "vocab.png")
    ctx.log_artifact(out / "report.md")
    ctx.log_artifact(out / "added_tokens.tsv")


def _metrics(ext: _Extension, before: dict, after: dict, losses: dict[str, float]) -> dict[str, float]:
    """What goes to MLflow: the ids added, the tokenizers before and after, mining time, the held-out losses."""
    metrics = {
        "added_tokens": float(len(ext.new_ids)),
        "tokens_per_char_before": before["tokens_per_char"],
        "tokens_per_char_after": after["tokens_per_char"],
        "unk_rate_before": before["unk_rate"],
        "unk_rate_after": after["unk_rate"],
        "unk_tokens_before": before["unk_tokens"],
        "unk_tokens_after": after["unk_tokens"],
        "speed_ratio": after["chars_per_s"] / max(before["chars_per_s"], 1e-9),
        "chars_per_s_before": before["chars_per_s"],
        "chars_per_s_after": after["chars_per_s"],
        "mining_seconds": ext.mined.seconds,
    }
    for name, value in losses.items():
        metrics["mlm_loss_" + name.split(" ")[0]] = value
    return metrics


def _text_bytes(corpus, split: str) -> int:
    """Uncompressed bytes of the split's text column, from the parquet footers (the progress bar's total)."""
    import pyarrow.parquet as pq

    from bertpipe.lib.corpusio import split_files

    total = 0
    for path in split_files(corpus, split):
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.to_arrow_schema().get_field_index("text")
        total += sum(meta.row_group(i).column(col).total_uncompressed_size for i in range(meta.num_row_groups))
    return total


def _rows(ext_tok, base_tok, mined, new_ids) -> list[dict]:
    by_word = {c.word: c for c in mined.candidates}
    unk_freq = dict(mined.unk_forms)
    tokens = ext_tok.convert_ids_to_tokens(new_ids)
    pieces = embeddings.piece_ids(base_tok, tokens)
    rows = []
    for i, tok, pc in zip(new_ids, tokens, pieces):
        c = by_word.get(tok)
        rows.append(
            {
                "id": i,
                "token": tok,
                "kind": ("glossary" if c.glossary else "word") if c else "unk_char",
                "freq": c.freq if c else unk_freq.get(tok, 0),
                "pieces": len(pc),
                "base_pieces": base_tok.convert_ids_to_tokens(pc),
                "pmi": c.pmi if c else float("nan"),
                "score": c.score if c else float("nan"),
            }
        )
    return rows


def _glossary_rows(glossary, base_tok, ext_tok, mined) -> list[dict]:
    freq = mined.glossary_freq
    rows, seen = [], set()
    for t in glossary:
        if t.word in seen:
            continue
        seen.add(t.word)
        rows.append(
            {
                "term": t.word,
                "source": t.source,
                "freq": freq.get(t.word, freq.get(t.word.lower(), 0)),
                "in_base": len(model_families.word_piece_ids(base_tok, [t.word])[0]) == 1,
                "one_token": len(model_families.word_piece_ids(ext_tok, [t.word])[0]) == 1,
            }
        )
    return rows
