"""The vocab stage: mine domain words, extend the starting encoder's tokenizer, resize the model and initialise the
new rows. The starting encoder is the base, or on a retrain the champion (``bertpipe.lib.lineage``): its ids never move.

Output (``ctx.out``): ``tokenizer/``, ``model/`` (model + the same tokenizer, loadable with the Auto classes alone),
``added_tokens.tsv``, ``report.md``, ``vocab.png``.
"""

from __future__ import annotations

from pathlib import Path

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


def build(ctx) -> dict:
    from bertpipe.lib import startrecord as S
    from bertpipe.lib.layout import read_start
    from bertpipe.lib.modelinfo import clamp_seq_len

    p = ctx.params
    language = ctx.cfg.params.model.language
    torch.manual_seed(p.seed)
    start = read_start(ctx.inputs["start"])  # the start stage's decision (the model/tokenizer inputs follow it)
    if start is None:
        raise BertpipeError(f"{ctx.inputs['start']}: not a start decision (run `bertpipe start` first)")
    described = S.describe(start, ctx.inputs["model"])
    ctx.log(f"extending {described}")
    glossary = _glossaries(ctx)
    corpus = ctx.inputs["corpus"]
    train = read_texts(corpus, "train", limit=HEAD_TEXTS)
    valid = read_texts(corpus, "valid", limit=HEAD_TEXTS)
    if not train:
        raise BertpipeError(f"{corpus}/train: no non-empty 'text' rows to mine")
    base_tok = extend.load_tokenizer(ctx.inputs["tokenizer"])

    workers = mining.count.workers_budget()
    ctx.log(f"mining {split_rows(corpus, 'train')} train texts with jieba (HMM {'on' if p.hmm else 'off'}, "
            f"{workers} worker(s))")
    # Mined against the starting tokenizer: words it already has (a champion's earlier additions) are one piece
    # and never candidates again, so only new words are added, after every existing id.
    mined = mining.mine_batches(iter_text_batches(corpus, "train"), base_tok, language, p, glossary,
                                workers=workers, total_bytes=_text_bytes(corpus, "train"))
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

    # Which initialisation of the new rows predicts held-out text best: each candidate on the same masked positions.
    eval_texts = valid[: p.eval_texts]
    kw = dict(max_length=max_length, seed=p.seed)
    losses: dict[str, float] = {}
    if eval_texts:
        losses["start (its own tokenizer)"] = embeddings.mlm_loss(model, base_tok, eval_texts, **kw)
    scored = embeddings.compare_inits(model, base_tok, ext_tok, eval_texts, embeddings.INITS, **kw) \
        if eval_texts and new_ids else {}
    losses.update({f"{m} init": v for m, v in scored.items()})
    chosen, why = embeddings.choose_init(p.init, scored)
    ctx.log(f"init of the {len(new_ids)} new rows: {chosen} ({why})")
    init_stats = embeddings.extend_model(model, base_tok, ext_tok, chosen, seed=p.seed)
    model.config.update({S.KEY: S.lineage_record(start)})

    out = Path(ctx.out)
    ext_tok.save_pretrained(out / "tokenizer")
    model.save_pretrained(out / "model")
    ext_tok.save_pretrained(out / "model")
    from bertpipe.lib import modelcard

    modelcard.write(out / "model", ctx, pipeline_tag="fill-mask", base_model=str(ctx.inputs.get("model") or ""),
                    metrics={f"mlm_loss {k}": v for k, v in losses.items()},
                    notes=f"The base encoder with {len(new_ids)} domain words added to its vocabulary ({chosen} init).")

    ctx.log(f"measuring the tokenizers on {len(valid)} valid texts")
    stats_texts = valid or train[:1000]
    before, after = extend.compare_tokenizers(base_tok, ext_tok, stats_texts)

    rows = _rows(ext_tok, base_tok, mined, new_ids)
    report.write_added_tokens(out / "added_tokens.tsv", rows)
    glossary_rows = _glossary_rows(glossary, base_tok, ext_tok, mined)
    report.write_report(
        out / "report.md",
        language=language,
        base_src=str(ctx.inputs["tokenizer"]),
        model_src=str(ctx.inputs["model"]),
        start=described,
        mining=mined,
        rows=rows,
        before=before,
        after=after,
        losses=losses,
        init=(chosen, why),
        glossary_rows=glossary_rows,
        head_note=head_note,
        params=ctx.cfg.section_dict("vocab"),
    )
    if report.write_figure(out / "vocab.png", before, after, losses):
        ctx.log_artifact(out / "vocab.png")
    ctx.log_artifact(out / "report.md")
    ctx.log_artifact(out / "added_tokens.tsv")

    ctx.counts.update(
        {
            "train_texts": split_rows(corpus, "train"),
            "valid_texts": len(valid),
            "start_vocab_size": len(base_tok),
            "added_tokens": len(new_ids),
            "added_words": sum(r["kind"] != "unk_char" for r in rows),
            "added_unk_chars": sum(r["kind"] == "unk_char" for r in rows),
            "glossary_terms": len(glossary),
            "candidates": mined.n_candidates,
            "vocab_size": len(ext_tok),
            "embedding_rows": int(init_stats.get("rows", len(ext_tok))),
        }
    )
    metrics = {
        "added_tokens": float(len(new_ids)),
        "tokens_per_char_before": before["tokens_per_char"],
        "tokens_per_char_after": after["tokens_per_char"],
        "unk_rate_before": before["unk_rate"],
        "unk_rate_after": after["unk_rate"],
        "unk_tokens_before": before["unk_tokens"],
        "unk_tokens_after": after["unk_tokens"],
        "speed_ratio": after["chars_per_s"] / max(before["chars_per_s"], 1e-9),
        "chars_per_s_before": before["chars_per_s"],
        "chars_per_s_after": after["chars_per_s"],
        "mining_seconds": mined.seconds,
    }
    for name, value in losses.items():
        metrics["mlm_loss_" + name.split(" ")[0]] = value
    ctx.log_metrics(metrics)
    ctx.log(
        f"tokens/char {before['tokens_per_char']:.4f} -> {after['tokens_per_char']:.4f}, "
        f"UNK chars/char {before['unk_rate']:.2e} -> {after['unk_rate']:.2e}, speed {metrics['speed_ratio']:.2f}x"
    )
    # Strings go to the manifest only (MLflow metrics are numbers).
    return {**metrics, "init": chosen, "init_reason": why, "start": described}


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
