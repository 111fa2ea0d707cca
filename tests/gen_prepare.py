"""A generated corpus of unique documents with planted duplicates, for prepare's scale test and bench.

Documents are random sequences of the sentences of the bundled laws sample (tests/data/prepare/laws_small.db), so
two documents share few 5-grams; planted among them: exact copies (whitespace changed), near copies (a few
characters changed, 5-gram Jaccard about 0.9) and task leaks (a finetune dev/test text as a whole document, or
inside one). ``python tests/gen_prepare.py OUT.jsonl MB`` writes one.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

DB = Path(__file__).parent / "data" / "prepare" / "laws_small.db"


def sentences() -> list[str]:
    with sqlite3.connect(DB) as con:
        texts = [r[0] for r in con.execute("SELECT article_text FROM articles ORDER BY id")]
    out = [s for t in texts for s in re.split(r"(?<=[。；：])", t) if len(s.strip()) >= 8]
    return sorted(set(s.strip() for s in out))


@dataclass
class Planted:
    exact: dict[str, str] = field(default_factory=dict)  # copy id -> original id
    near: dict[str, str] = field(default_factory=dict)
    leak_exact: list[str] = field(default_factory=list)  # ids of documents equal to a task text
    leak_contains: list[str] = field(default_factory=list)  # ids of documents containing one
    task_texts: list[str] = field(default_factory=list)


def _change(text: str, rng: random.Random, k: int) -> str:
    chars = list(text)
    for pos in rng.sample(range(len(chars)), k):
        chars[pos] = "国" if chars[pos] != "国" else "民"
    return "".join(chars)


def generate(path: Path, mb: float, seed: int = 0, planted_each: int = 30) -> Planted:
    """Write ``path`` (jsonl: id, text, group) of about ``mb`` MB of UTF-8 text; returns what was planted."""
    rng = random.Random(seed)
    pool = sentences()
    target = int(mb * 1e6)
    planted = Planted()
    written = 0
    originals: list[tuple[str, str]] = []
    task_pool = [s for s in pool if len(s) >= 30]
    rng.shuffle(task_pool)
    planted.task_texts = [f"测试集样例{i}：{s}" for i, s in enumerate(task_pool[: 2 * planted_each])]
    with open(path, "w", encoding="utf-8") as fh:
        def put(doc_id: str, text: str) -> None:
            nonlocal written
            fh.write(json.dumps({"id": doc_id, "text": text, "group": doc_id}, ensure_ascii=False) + "\n")
            written += len(text.encode("utf-8"))

        i = 0
        while written < target:
            doc_id = f"g{i}"
            text = "".join(rng.sample(pool, rng.randint(8, 24)))  # no sentence twice: char_repeat keeps it
            put(doc_id, text)
            if i % 97 == 5 and len(originals) < 2 * planted_each:
                originals.append((doc_id, text))
            i += 1
            k = len(originals)
            # plant copies well after their originals, so they land in other batches
            if i % 211 == 0 and k > 1:
                oid, otext = originals[(i // 211) % k]
                kind = (i // 211) % 4
                if kind == 0 and len(planted.exact) < planted_each and oid not in planted.exact.values():
                    planted.exact[f"x{i}"] = oid
                    put(f"x{i}", " ".join([otext[:40], otext[40:]]).upper())
                elif kind == 1 and len(planted.near) < planted_each and oid not in planted.near.values():
                    planted.near[f"n{i}"] = oid
                    put(f"n{i}", _change(otext, rng, max(2, len(otext) // 150)))
                elif kind == 2 and len(planted.leak_exact) < planted_each:
                    planted.leak_exact.append(f"t{i}")
                    put(f"t{i}", planted.task_texts[len(planted.leak_exact) - 1])
                elif kind == 3 and len(planted.leak_contains) < planted_each:
                    planted.leak_contains.append(f"c{i}")
                    inner = planted.task_texts[planted_each + len(planted.leak_contains) - 1]
                    put(f"c{i}", "".join(rng.sample(pool, 4)) + inner + rng.choice(pool))
    return planted


if __name__ == "__main__":
    p = generate(Path(sys.argv[1]), float(sys.argv[2]))
    print(json.dumps({"exact": len(p.exact), "near": len(p.near), "leaks": len(p.leak_exact) + len(p.leak_contains)}))
