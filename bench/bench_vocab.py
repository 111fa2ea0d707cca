"""Tokenizer-extension benchmark on the real Chinese legal corpus: speed, tokens/char and exactness of two mechanisms.

A. added tokens (what the vocab stage does): words matched on the raw text by the tokenizers library's
   Aho-Corasick pass, before BERT's normaliser spaces CJK characters out.
B. words in the WordPiece vocab, with the normaliser's CJK splitting replaced by a Split pre-tokenizer whose regex
   isolates the added words (a trie-shaped alternation) and every other CJK character.
C. B's naive form: just turn CJK splitting off and let WordPiece's greedy longest match segment CJK runs over a vocab
   holding the words (characters inside a run become ##-pieces: other ids than before).

For each mechanism and number of added words: throughput relative to the base tokenizer measured in the same run
(best of N passes over the same texts), tokens per character, and the share of texts whose tokenisation differs from
the base's once every added word is expanded back into its base pieces (0 means "everything else is as before").

    .venv/bin/python bench/bench_vocab.py [--texts 4000] [--sizes 500,2000,5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per tokenizer: a fair same-run ratio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()  # long articles exceed 512 tokens; irrelevant when only tokenising

from bertpipe.stages.vocab.extend import extend_tokenizer, load_tokenizer  # noqa: E402
from bertpipe.stages.vocab.mining import mine_batches  # noqa: E402
from bertpipe.stages.vocab.params import VocabParams  # noqa: E402

CJK_CLASS = (
    r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}"
    r"\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"
)


def corpus(db: Path, n_mine: int, n_eval: int) -> tuple[list[str], list[str]]:
    with sqlite3.connect(db) as c:
        rows = [r[0] for r in c.execute("SELECT article_text FROM articles WHERE length(article_text) > 10 ORDER BY id")]
    # Interleave so the eval texts are held out but from the same laws.
    ev = rows[::7][:n_eval]
    held = set(ev)
    return [r for r in rows if r not in held][:n_mine], ev


def trie_regex(words: list[str]) -> str:
    """An alternation shaped like a trie, so the regex engine tries one branch per character, longest first."""
    trie: dict = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        ends = "" in node
        branches = [_esc(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if ends else body

    return emit(trie)


def _esc(ch: str) -> str:
    return "\\" + ch if ch in r".^$*+?()[]{}|\-/" else ch


def vocab_mechanism(base, words: list[str], naive: bool):
    """B (or C when ``naive``): the words appended to the WordPiece vocab, CJK splitting done by a regex instead."""
    with tempfile.TemporaryDirectory() as tmp:
        base.save_pretrained(tmp)
        data = json.loads((Path(tmp) / "tokenizer.json").read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]
        start = len(base)
        for i, w in enumerate(words):
            vocab[w] = start + i
        (Path(tmp) / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        tok = AutoTokenizer.from_pretrained(tmp)
    bt: Tokenizer = tok.backend_tokenizer
    bt.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=False, strip_accents=None, lowercase=True
    )
    if not naive:
        pattern = f"{trie_regex(sorted(words, key=len, reverse=True))}|{CJK_CLASS}"
        bt.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), pre_tokenizers.BertPreTokenizer()]
        )
    return tok


def speed(tok, texts: list[str], repeats: int) -> tuple[float, list[list[int]]]:
    best, ids = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = tok(texts, add_special_tokens=False)["input_ids"]
        best = min(best, time.perf_counter() - t0)
        ids = out
    return sum(len(t) for t in texts) / best, ids


def differs(tok, base, ids_list: list[list[int]], base_ids: list[list[int]], n_base: int) -> float:
    """Share of texts whose ids, with each new token expanded to its base pieces, differ from the base's."""
    cache: dict[int, list[int]] = {}
    bad = 0
    for ids, want in zip(ids_list, base_ids):
        out = []
        for i in ids:
            if i >= n_base:
                if i not in cache:
                    text = tok.convert_ids_to_tokens(i).removeprefix("##")
                    cache[i] = base(text, add_special_tokens=False)["input_ids"]
                out.extend(cache[i])
            else:
                out.append(i)
        bad += out != want
    return bad / max(1, len(ids_list))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", default=str(REPO / "data" / "raw"))
    ap.add_argument("--texts", type=int, default=4000, help="held-out articles tokenised per pass")
    ap.add_argument("--mine-texts", type=int, default=12000)
    ap.add_argument("--sizes", default="500,2000,5000")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    raw = Path(args.raw)
    base = load_tokenizer(raw / "bert-base-chinese")
    mine_texts, texts = corpus(raw / "china_law" / "laws.db", args.mine_texts, args.texts)
    sizes = [int(s) for s in args.sizes.split(",")]
    n_chars = sum(len(t) for t in texts)
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; eval {len(texts)} texts, {n_chars} chars")

    t0 = time.time()
    mined = mine_batches([mine_texts], base, "zh", VocabParams(top_k=max(sizes), min_freq=2, unk_char_min_freq=0))
    words = [c.word for c in mined.candidates]
    print(f"mined {len(words)} words from {mined.n_chars} chars in {time.time() - t0:.1f}s")

    base_speed, base_ids = speed(base, texts, args.repeats)
    base_tpc = sum(len(x) for x in base_ids) / n_chars
    print(f"{'mechanism':<28}{'added':>7}{'chars/s':>12}{'vs base':>9}{'tok/char':>10}{'texts differ':>14}")
    print(f"{'base':<28}{0:>7}{base_speed:>12.0f}{1.0:>9.2f}{base_tpc:>10.4f}{0.0:>14.4f}")
    for k in sizes:
        ws = words[:k]
        candidates = [
            ("A added tokens (chosen)", extend_tokenizer(base, ws)),
            ("B vocab + trie-regex split", vocab_mechanism(base, ws, naive=False)),
            ("C vocab, no CJK split", vocab_mechanism(base, ws, naive=True)),
        ]
        for name, tok in candidates:
            base_speed, _ = speed(base, texts, args.repeats)  # re-measured beside each one: load drifts
            s, ids = speed(tok, texts, args.repeats)
            tpc = sum(len(x) for x in ids) / n_chars
            diff = differs(tok, base, ids, base_ids, len(base))
            print(f"{name:<28}{len(ws):>7}{s:>12.0f}{s / base_speed:>9.2f}{tpc:>10.4f}{diff:>14.4f}", flush=True)
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
