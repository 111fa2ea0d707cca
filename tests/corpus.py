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
