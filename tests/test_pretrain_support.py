"""Helpers shared by the pretrain tests (no tests here): real corpora written as prepared parquet, params files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from tests.corpus import law_texts  # noqa: F401

QUIET = {"log_every": 5, "fill_mask_samples": 2, "threads": 1}
TINY_ARCH = {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 128}


def english_texts() -> list[str]:
    """Real English prose: the dataset descriptions shipped with scikit-learn, one paragraph per document."""
    import sklearn.datasets

    out = []
    for f in sorted((Path(sklearn.datasets.__file__).parent / "descr").glob("*.rst")):
        out += [p.replace("\n", " ").strip() for p in f.read_text().split("\n\n") if len(p.split()) > 8]
    return out


def write_corpus(out: Path, train: list[str], valid: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, texts in (("train", train), ("valid", valid)):
        pq.write_table(
            pa.table({"id": [f"{name}-{i}" for i in range(len(texts))], "text": texts, "group": ["g"] * len(texts)}),
            out / f"{name}.parquet",
        )
    return out


def write_params(tmp: Path, model: dict, base: dict | None = None, pretrain: dict | None = None) -> Path:
    data = {
        "paths": {"raw": str(tmp / "raw"), "work": str(tmp / "work"), "state": str(tmp / "state")},
        "model": model,
        "base": {**QUIET, **(base or {})},
        "pretrain": {**QUIET, **(pretrain or {})},
    }
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path
