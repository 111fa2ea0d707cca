"""domain_adaptation: prepare -> [base] -> vocab -> pretrain -> finetune (tasks x encoders) -> evaluate -> register.

Run with `bertpipe run` or `python -m flows.domain_adaptation [--params params.yaml] [--until STAGE]`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tasks.env import prefect_env

prefect_env()

from prefect import flow  # noqa: E402

from bertpipe.config import load_config  # noqa: E402
from bertpipe.pipeline import all_stages  # noqa: E402
from bertpipe.tracking import flow_run  # noqa: E402
from tasks.stages import task_for  # noqa: E402


def _warm_imports() -> None:
    """transformers resolves its lazy attributes on first access, and that is not thread-safe: import what the
    concurrent finetune tasks need once, here, before the task runner starts them in threads."""
    import transformers  # noqa: F401
    from transformers import (  # noqa: F401
        AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForQuestionAnswering,
        AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer, pipeline,
    )

    import bertpipe.evaluate.stage  # noqa: F401
    import bertpipe.finetune.stage  # noqa: F401


def _order(names: list[str], until: str | None) -> list[str]:
    if until is None:
        return names
    matches = [i for i, n in enumerate(names) if n == until or n.startswith(until + "/")]
    if not matches:
        raise ValueError(f"--until {until!r}: not a stage of this pipeline ({names})")
    return names[: max(matches) + 1]


@flow(name="domain_adaptation", log_prints=True)
def domain_adaptation(
    params: str = "params.yaml", profile: str | None = None, overrides: list[str] | None = None,
    until: str | None = None,
) -> dict:
    overrides = list(overrides or [])
    params = str(Path(params).resolve())
    cfg = load_config(params, profile, overrides)
    stages = all_stages(cfg)
    names = _order(list(stages), until)
    results: dict[str, dict] = {}
    with flow_run(cfg, "domain_adaptation", {"bertpipe.until": until or "register"}) as parent:
        i = 0
        while i < len(names):
            name = names[i]
            if name.startswith("finetune/"):
                # Independent finetune runs go to the task runner together, at most flow.max_parallel at a time;
                # when several run at once each gets its own process (see tasks.stages._isolated).
                _warm_imports()
                batch = [n for n in names[i:] if n.startswith("finetune/")]
                width = max(1, cfg.params.flow.max_parallel)
                isolated = width > 1 and len(batch) > 1
                for j in range(0, len(batch), width):
                    futures = {n: task_for(stages[n], cfg).submit(n, params, profile, overrides, isolated)
                               for n in batch[j : j + width]}
                    for n, fut in futures.items():
                        results[n] = fut.result()
                i += len(batch)
                continue
            results[name] = task_for(stages[name], cfg)(name, params, profile, overrides)
            i += 1
        parent.set_tags({f"bertpipe.fingerprint.{k}": v["fingerprint"] for k, v in results.items()})
    return results


def summary(results: dict, cfg) -> str:
    """What a person wants at the end: what ran, where the report is, what got registered, how to browse it."""
    import json

    from bertpipe.tracking import display_uri, tracking_uri

    lines = [f"{name:40s} {'up to date' if r['skipped'] else 'built':12s} {r['out']}" for name, r in results.items()]
    report = cfg.work / "evaluate" / "report.md"
    if report.exists():
        lines.append(f"report: {report}")
    registry = cfg.work / "register" / "registry.json"
    if registry.exists():
        reg = json.loads(registry.read_text())
        for m in reg.get("models", []):
            if not m.get("registered", True):
                lines.append(f"not registered: {m['name']} ({m['reason']})")
                continue
            aliases = ",".join(m.get("aliases", [])) or "-"
            lines.append(f"registered: {m['name']} version {m['version']} aliases [{aliases}]")
    uri = display_uri(tracking_uri(cfg))
    lines.append(f"browse: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port 5000")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--until", default=None)
    a = ap.parse_args(argv)
    results = domain_adaptation(a.params, a.profile, a.overrides, a.until)
    print(summary(results, load_config(a.params, a.profile, a.overrides)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
