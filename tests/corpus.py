"""Real text for tests: articles of Chinese laws from the laws.db sample."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def law_texts(raw: Path, n: int, offset: int = 0) -> list[str]:
    """``n`` article texts longer than 20 characters, in id order, from ``raw/china_law/laws.db``."""
    with sqlite3.connect(raw / "china_law" / "laws.db") as db:
        rows = db.execute(
            "SELECT article_text FROM articles WHERE length(article_text) > 20 ORDER BY id LIMIT ? OFFSET ?",
            (n, offset),
        ).fetchall()
    return [r[0] for r in rows]


def tiny_sentiment_rows() -> list[tuple[str, str]]:
    """Sixteen short reviews, eight a label, all distinct: the splits stage's stratified dev and test splits get
    examples of each label (it refuses a split it would leave empty)."""
    pos = ["很好", "不错", "满意", "喜欢", "推荐", "完美", "优秀", "超值"]
    neg = ["太差", "糟糕", "失望", "垃圾", "退货", "难用", "坑人", "后悔"]
    return [row for p, n in zip(pos, neg) for row in ((p, "pos"), (n, "neg"))]
