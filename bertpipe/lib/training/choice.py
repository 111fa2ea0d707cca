"""Which encoder's finetune of a task is exported and registered: the best non-degenerate one by dev score.

Each candidate is a ``finetune/<task>/<encoder>`` output; its score is ``summary.dev.<primary>.mean`` from its
metrics.json (dev, never test: choosing on test would leak into the registered score). A run whose metrics.json says
``"degenerate": true`` (it collapsed: one class, no entity, or no better than the majority) is skipped while any
other is not; when every candidate is degenerate, the best of them is still chosen and marked ``degenerate``, so
register can refuse it. Ties and missing dev scores go to the more adapted encoder (tapt, then adapted, then base):
the pipeline's product is the adapted model, the base its control.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertpipe.infra.errors import BertpipeError

SELECTION_FILE = "selection.json"
PREFERENCE = ("tapt", "adapted", "base")  # on a tie, the first of these


@dataclass
class Choice:
    encoder: str
    source: str  # the chosen finetune output dir (its model/ is exported)
    primary: str
    dev: dict[str, float | None] = field(default_factory=dict)  # encoder -> dev primary mean (None: no dev score)
    degenerate_encoders: list[str] = field(default_factory=list)
    degenerate: bool = False  # every candidate was degenerate: the chosen one too

    def words(self) -> str:
        scores = ", ".join(f"{e} {'n/a' if v is None else f'{v:.4f}'}"
                           + (" (degenerate)" if e in self.degenerate_encoders else "") for e, v in self.dev.items())
        note = "; every candidate is degenerate" if self.degenerate else ""
        return f"`{self.encoder}` encoder, the best by dev {self.primary} ({scores}){note}"

    def record(self) -> dict:
        return asdict(self)


def _dev_score(m: dict, primary: str) -> float | None:
    v = (((m.get("summary") or {}).get("dev") or {}).get(primary) or {}).get("mean")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def _metrics(d: Path) -> dict:
    path = Path(d) / "metrics.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertpipeError(f"{path}: missing (run {Path(d).parent.name}'s finetune first)") from None
    except ValueError as e:
        raise BertpipeError(f"{path}: not JSON ({e})") from None


def choose(candidates: dict[str, Path | str]) -> Choice:
    """The finetune to export among ``candidates`` ({encoder: finetune output dir}, at least one)."""
    if not candidates:
        raise BertpipeError("no finetuned encoder to choose from")
    metrics = {e: _metrics(Path(d)) for e, d in candidates.items()}
    primary = next((m.get("primary") for m in metrics.values() if m.get("primary")), None)
    if not primary:
        raise BertpipeError(f"{Path(next(iter(candidates.values()))) / 'metrics.json'}: key 'primary' is missing")
    dev = {e: _dev_score(m, primary) for e, m in metrics.items()}
    degenerate = [e for e, m in metrics.items() if m.get("degenerate") is True]

    def rank(e: str) -> tuple:
        pref = PREFERENCE.index(e) if e in PREFERENCE else len(PREFERENCE)
        return (e not in degenerate, dev[e] is not None, dev[e] if dev[e] is not None else 0.0, -pref)

    best = max(candidates, key=rank)
    return Choice(best, str(candidates[best]), primary, dev, degenerate, best in degenerate)


def read_selection(export_dir: Path) -> dict | None:
    """An export stage output's recorded choice, if it made one (task exports do; students and the encoder not)."""
    try:
        return json.loads((Path(export_dir) / SELECTION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
