"""What a person looks at after pretraining: loss curves (PNG), a fill-mask sanity sample and report.md."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from bertpipe.lib.mlm.data import Example


def loss_plot(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [h for h in history if "loss" in h]
    ev = [h for h in history if "eval_loss" in h]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([h["step"] for h in train], [h["loss"] for h in train], label="train MLM loss", alpha=0.7)
    if train and "pair_loss" in train[0]:
        ax.plot([h["step"] for h in train], [h["pair_loss"] for h in train], label="train pair loss", alpha=0.7)
    if train and "disc_loss" in train[0]:  # RTD: "loss" is the generator's MLM loss
        ax.plot([h["step"] for h in train], [h["disc_loss"] for h in train], label="train discriminator loss",
                alpha=0.7)
    if ev:
        ax.plot([h["step"] for h in ev], [h["eval_loss"] for h in ev], "o-", label="held-out loss (the objective)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def fill_mask_samples(mlm, tokenizer, examples: list[Example], n: int, max_tokens: int = 48) -> list[dict]:
    """Mask the longest word of the first ``n`` held-out segments and show the model's top guesses for it."""
    mlm.eval()
    device = next(mlm.parameters()).device
    rows = []
    for e in examples[:n]:
        ids = e.ids[: max_tokens - 1].astype(np.int64)
        words = e.words[: max_tokens - 1]
        ids = np.append(ids, tokenizer.sep_token_id) if ids[-1] != tokenizer.sep_token_id else ids
        words = np.append(words, -1) if len(words) < len(ids) else words
        cand = [w for w in np.unique(words[words >= 0])]
        if not cand:
            continue
        sizes = {w: int((words == w).sum()) for w in cand}
        word = max(cand, key=lambda w: (sizes[w], -abs(int(np.argmax(words == w)) - len(ids) // 2)))
        pos = np.flatnonzero(words == word)
        masked = ids.copy()
        masked[pos] = tokenizer.mask_token_id
        logits = mlm(input_ids=torch.from_numpy(masked[None]).to(device)).logits[0, pos].float()
        top = logits.topk(3, dim=-1).indices.tolist()
        best = [t[0] for t in top]
        rows.append(
            {
                "text": _join(tokenizer.decode(masked[1:-1])),
                "truth": _join(tokenizer.decode(ids[pos])),
                "predicted": _join(tokenizer.decode(best)),
                "top3": [" / ".join(tokenizer.convert_ids_to_tokens(t)) for t in top],
                "correct": best == ids[pos].tolist(),
            }
        )
    return rows


def _join(s: str) -> str:
    """BERT's decode puts a space between CJK characters; drop the spaces that have a CJK character on a side."""
    import re

    return re.sub(r"(?<=[\u3000-\u9fff\uff00-\uffef]) | (?=[\u3000-\u9fff\uff00-\uffef])", "", s)


def write_report(path: Path, summary: dict, samples: list[dict]) -> None:
    lines = [f"# {summary['stage']} stage: masked-language-model pretraining", ""]
    lines += [f"- **{k}**: {v}" for k, v in summary["facts"].items()]
    lines += ["", "![loss curves](loss.png)", "", "## Held-out MLM loss", "", "| step | tokens | loss | perplexity |",
              "|---:|---:|---:|---:|"]
    for h in summary["evals"]:
        lines.append(f"| {h['step']} | {h['tokens']:.0f} | {h['eval_loss']:.4f} | {h['eval_ppl']:.1f} |")
    lines += ["", "## Fill-mask sanity sample", "",
              "The longest word of held-out segments is masked (every piece of it); top-3 guesses per masked token.", "",
              "| masked text | truth | predicted | top-3 per token |", "|---|---|---|---|"]
    for r in samples:
        text = r["text"].replace("|", "\\|")
        lines.append(f"| {text} | {r['truth']} | {r['predicted']}{' ✓' if r['correct'] else ''} | "
                     f"{'; '.join(r['top3'])} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_outputs(ctx, res, filler, tokenizer, valid_ex: list[Example], n_samples: int, facts: dict, metrics: dict,
                  loss_title: str) -> None:
    """What a masked-LM stage (pretrain, TAPT) writes beside its model under ``ctx.out``: ``loss.png``,
    ``report.md`` (its facts, the held-out curve, fill-mask samples of ``filler``) and ``metrics.json``; the plot and
    the report are logged with the stage's run."""
    out = Path(ctx.out)
    loss_plot(res.history, out / "loss.png", loss_title)
    samples = fill_mask_samples(filler, tokenizer, valid_ex, n_samples)
    evals = [h for h in res.history if "eval_loss" in h]  # the report's curve
    write_report(out / "report.md", {"stage": ctx.name, "facts": facts, "evals": evals}, samples)
    (out / "metrics.json").write_text(json.dumps({**metrics, "history": res.history}, indent=1) + "\n")
    for f in ("loss.png", "report.md"):
        ctx.log_artifact(out / f)
