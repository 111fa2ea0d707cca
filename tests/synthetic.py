"""Tiny encoders and learnable synthetic tasks, for tests, benches and smoke runs of the finetune and evaluate
stages (outside the package: no stage imports them, so editing them rebuilds nothing)."""

from __future__ import annotations

import json
import random
from pathlib import Path

FILLER = list("的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经")
KEYS = {"pos": "好", "neg": "坏", "mid": "平"}
PEOPLE = ["张三", "李四", "王五", "Alice", "Bob"]
PLACES = ["北京", "上海", "广州", "London", "Paris"]


def tiny_encoder(out: Path, tokenizer_dir: Path, layers: int = 2, hidden: int = 64, seed: int = 0,
                 with_mlm_head: bool = True, positions: int = 512, heads: int = 2, intermediate: int = 0) -> Path:
    """A randomly initialised BERT (MLM or headless) with a real tokenizer, saved with save_pretrained; small by
    default, any shape by its arguments (``intermediate`` 0: twice ``hidden``)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM, BertModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=intermediate or hidden * 2, max_position_embeddings=positions)
    model = BertForMaskedLM(cfg) if with_mlm_head else BertModel(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _filler(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(FILLER) for _ in range(n))


def keyword_classification(n: int, seed: int = 0, labels=("pos", "neg")) -> list[dict]:
    """The label's keyword appears once somewhere in a random sentence: learnable from one token."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lab = labels[i % len(labels)]
        a, b = _filler(rng, rng.randint(3, 12)), _filler(rng, rng.randint(3, 12))
        out.append({"id": i, "text": a + KEYS[lab] + b, "label": lab})
    return out


def pair_classification(n: int, seed: int = 0) -> list[dict]:
    """Sentence pairs labelled by the keyword of the second text, so the pair encoding must carry it."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        same = i % 2 == 0
        out.append({"id": i, "text": _filler(rng, 5) + rng.choice("好坏") + _filler(rng, 4),
                    "text_pair": _filler(rng, 4) + ("是" if same else "否") + _filler(rng, 5),
                    "label": "same" if same else "diff"})
    return out


def ner_sentences(n: int, seed: int = 0) -> list[dict]:
    """jsonl NER records (text + character spans): names of people and places in filler, mixed scripts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        parts, spans, pos = [], [], 0
        for _ in range(rng.randint(1, 3)):
            f = _filler(rng, rng.randint(1, 4))
            parts.append(f)
            pos += len(f)
            kind = rng.choice(["PER", "LOC"])
            name = rng.choice(PEOPLE if kind == "PER" else PLACES)
            if name.isascii():  # keep English words apart so they stay whole words
                name = f" {name} "
                spans.append({"start": pos + 1, "end": pos + len(name) - 1, "label": kind})
            else:
                spans.append({"start": pos, "end": pos + len(name), "label": kind})
            parts.append(name)
            pos += len(name)
        parts.append(_filler(rng, 2))
        out.append({"id": i, "text": "".join(parts), "spans": spans})
    return out


def squad(n: int, seed: int = 0) -> dict:
    """SQuAD/CMRC-format data: "where is X" asked of a context that says X is in PLACE."""
    rng = random.Random(seed)
    paras = []
    for i in range(n):
        who, where = rng.choice(PEOPLE[:3]), rng.choice(PLACES[:3])
        pre = _filler(rng, rng.randint(2, 10))
        ctx = f"{pre}。{who}住在{where}。{_filler(rng, rng.randint(2, 10))}。"
        start = ctx.index(f"住在{where}") + 2
        paras.append({"id": f"p{i}", "context": ctx, "qas": [
            {"id": f"q{i}", "question": f"{who}住在哪里？", "answers": [{"text": where, "answer_start": start}]}]})
    return {"version": "v1.0", "data": [{"id": "synthetic", "title": "synthetic", "paragraphs": paras}]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path
