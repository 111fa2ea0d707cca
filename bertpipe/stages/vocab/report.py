"""What the vocab stage writes for people: added_tokens.tsv, report.md and a before/after figure."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence


def _fmt(x: float, digits: int = 4) -> str:
    if x != x:
        return "n/a"
    return f"{x:.{digits}f}"


def write_added_tokens(path: Path, rows: Sequence[dict]) -> None:
    """One line per new id: id, token, kind (glossary/word/unk_char), train frequency, base pieces, PMI, score."""
    cols = ["id", "token", "kind", "freq", "pieces", "base_pieces", "pmi", "score"]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\t".join(cols) + "\n")
        for r in rows:
            fh.write(
                "\t".join(
                    [
                        str(r["id"]),
                        r["token"],
                        r["kind"],
                        str(r["freq"]),
                        str(r["pieces"]),
                        " ".join(r["base_pieces"]),
                        _fmt(r["pmi"], 3),
                        _fmt(r["score"], 1),
                    ]
                )
                + "\n"
            )


def write_figure(path: Path, before: dict, after: dict, losses: dict[str, float]) -> bool:
    """Bars of tokens/char, [UNK] rate, speed (and MLM loss by init); False when matplotlib is unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [
        ("tokens per character", "tokens_per_char"),
        ("[UNK] characters per character", "unk_rate"),
        ("throughput (chars/s)", "chars_per_s"),
    ]
    n = len(panels) + (1 if losses else 0)
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3.2))
    for ax, (title, key) in zip(axes, panels):
        ax.bar(["base", "extended"], [before[key], after[key]], color=["#888888", "#2a7ab9"])
        ax.set_title(title, fontsize=10)
    if losses:
        ax = axes[-1]
        names = list(losses)
        ax.bar(names, [losses[k] for k in names], color="#c0504d")
        ax.set_title("valid MLM loss after extension", fontsize=10)
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(
    path: Path,
    *,
    language: str,
    base_src: str,
    model_src: str,
    mining,
    start: str = "",
    init: tuple[str, str] = ("", ""),
    rows: Sequence[dict],
    before: dict,
    after: dict,
    losses: dict[str, float],
    glossary_rows: Sequence[dict],
    head_note: str,
    params: dict,
    top_n: int = 200,
) -> None:
    lines = [
        "# vocab: domain words added to the tokenizer",
        "",
        *_summary(language, base_src, model_src, mining, start, rows, head_note),
        "",
        f"- new rows initialised with **{init[0]}** ({init[1]})" if init[0] else "",
        "",
        *_tokenizers(before, after),
        *_losses(losses),
        *_glossary(glossary_rows),
        *_added(rows, top_n),
        "", "## Params", "", "```", *(f"{k}: {v}" for k, v in params.items()), "```", "",
    ]
    Path(path).write_text("\n".join(lines), encoding="utf-8")


def _summary(language: str, base_src: str, model_src: str, mining, start: str, rows: Sequence[dict],
             head_note: str) -> list[str]:
    """What was extended, what was mined, what was added and how, and the MLM head."""
    words = [r for r in rows if r["kind"] != "unk_char"]
    chars = [r for r in rows if r["kind"] == "unk_char"]
    return [
        f"- extended: {start or model_src}; tokenizer `{base_src}`, model `{model_src}`; language: {language}. Every "
        "id of the starting tokenizer keeps its number; new ids follow them.",
        f"- mined {mining.n_texts} train texts ({mining.n_chars} characters, {mining.n_words} jieba "
        f"words) in {mining.seconds:.1f} s; {mining.n_candidates} candidates passed the filters"
        + (f" (counts pruned to the most frequent words: a frequency may be low by at most {mining.undercount})"
           if getattr(mining, "undercount", 0) else ""),
        f"- added {len(rows)} ids: {len(words)} words as added tokens "
        f"({sum(r['kind'] == 'glossary' for r in rows)} from glossaries), "
        f"{len(chars)} vocab entries for characters the base maps to [UNK]",
        "- mechanism: words are added tokens of the fast tokenizer (matched on the raw text before BERT's normaliser "
        "spaces CJK characters out; Latin words only as whole words); [UNK] characters are appended to the WordPiece "
        "vocab with their ## forms. Everything else tokenises exactly as before.",
        f"- MLM head: {head_note}",
    ]


def _tokenizers(before: dict, after: dict) -> list[str]:
    """The valid split through the starting and the extended tokenizer."""
    speed = after["chars_per_s"] / max(before["chars_per_s"], 1e-9)
    return [
        "## Valid split, before and after",
        "",
        "| | before (starting tokenizer) | extended |",
        "|---|---|---|",
        f"| tokens per character | {_fmt(before['tokens_per_char'])} | {_fmt(after['tokens_per_char'])} |",
        f"| [UNK] rate (unknown characters per character) | {_fmt(before['unk_rate'], 6)} | "
        f"{_fmt(after['unk_rate'], 6)} |",
        f"| [UNK] tokens | {int(before['unk_tokens'])} | {int(after['unk_tokens'])} |",
        f"| [UNK] per token (falls or rises with the token count) | {_fmt(before['unk_token_rate'], 6)} | "
        f"{_fmt(after['unk_token_rate'], 6)} |",
        f"| tokens | {int(before['tokens'])} | {int(after['tokens'])} |",
        f"| throughput (chars/s, best of 3, alternating) | {before['chars_per_s']:.0f} | {after['chars_per_s']:.0f} |",
        "",
        f"Extended/base speed: {speed:.2f}x.",
        "",
    ]


def _losses(losses: dict[str, float]) -> list[str]:
    """The held-out MLM loss of each initialisation (none without valid text)."""
    if not losses:
        return []
    return [
        "## MLM loss on held-out valid text right after extension",
        "",
        "Same masked positions for every extended model (15% of tokens, fixed seed); the lowest decides the init "
        "when vocab.init is `best`. `start` is the starting model with its own tokenizer, so its positions "
        "differ.",
        "",
        "| model | loss |",
        "|---|---|",
        *(f"| {k} | {_fmt(v)} |" for k, v in losses.items()),
        "",
    ]


def _glossary(glossary_rows: Sequence[dict]) -> list[str]:
    """Which glossary terms are one token after extension (none without glossaries)."""
    if not glossary_rows:
        return []
    covered = sum(1 for g in glossary_rows if g["one_token"])
    return [
        f"## Glossary coverage: {covered}/{len(glossary_rows)} terms are one token after extension",
        "",
        "| term | source | train freq | in base vocab | one token after |",
        "|---|---|---|---|---|",
        *(f"| {g['term']} | {g['source']} | {g['freq']} | {'yes' if g['in_base'] else 'no'} | "
          f"{'yes' if g['one_token'] else 'no'} |" for g in glossary_rows),
        "",
    ]


def _added(rows: Sequence[dict], top_n: int) -> list[str]:
    """The first ``top_n`` added tokens (added_tokens.tsv holds them all)."""
    return [
        f"## Added tokens (first {min(top_n, len(rows))} of {len(rows)}; all in added_tokens.tsv)",
        "",
        "| id | token | kind | train freq | base pieces | PMI | score |",
        "|---|---|---|---|---|---|---|",
        *(f"| {r['id']} | {r['token']} | {r['kind']} | {r['freq']} | {r['pieces']} | {_fmt(r['pmi'], 2)} | "
          f"{_fmt(r['score'], 1)} |" for r in rows[:top_n]),
    ]
