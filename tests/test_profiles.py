"""The shipped params.yaml profiles: each validates, and every budget in them is in steps (no wall clock), so a
stage's output depends on its fingerprint and not on the machine's load (docs/demo-budget.md); the own-domain
example's profiles run the protocol."""

from pathlib import Path

import pytest
import yaml

from bertpipe.graph.pipeline import load_config

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
PROFILES = PARAMS.with_name("profiles.yaml")  # the shipped profiles live beside params.yaml (out of DVC's view)


@pytest.mark.parametrize("profile", ["demo", "evidence", "full"])
def test_shipped_profile_validates_with_step_budgets(profile):
    cfg = load_config(str(PARAMS), profile, [])
    for section in ("base", "pretrain"):
        p = getattr(cfg.params, section)
        assert p.max_steps >= 1
        assert not getattr(p, "max_time_s", None), f"profiles.{profile}.{section}: a wall-clock budget"


def test_no_profile_sets_a_wall_clock_budget():
    def keys(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield f"{path}.{k}"
                yield from keys(v, f"{path}.{k}")

    profiles = yaml.safe_load(PROFILES.read_text())
    assert [k for k in keys(profiles) if k.endswith(".max_time_s")] == []


def test_no_profile_key_is_shadowed_by_the_top_level():
    """The file's own top-level keys win over the chosen profile (so `dvc exp run -S` takes effect): a key a profile
    sets that the top level sets too would be dead in that profile (the full profile's 512-token pretraining was, once)."""
    def leaves(node, path=()):
        if isinstance(node, dict) and node:
            for k, v in node.items():
                yield from leaves(v, (*path, k))
        else:
            yield path

    top = yaml.safe_load(PARAMS.read_text())
    assert "profiles" not in top and set(yaml.safe_load(PROFILES.read_text())) >= {"demo", "full"}

    def at_top(path):
        node = top
        for k in path:
            if not isinstance(node, dict) or k not in node:
                return False
            node = node[k]
        return True

    shadowed = [f"profiles.{name}.{'.'.join(p)}" for name, prof in yaml.safe_load(PROFILES.read_text()).items()
                for p in leaves(prof) if at_top(p)]
    assert shadowed == []


@pytest.mark.parametrize("profile", ["real", "smoke"])
def test_own_domain_example_runs_the_protocol(profile):
    """The params file README tells a user to copy runs the field's protocol by default (and its smoke run the same
    wiring in miniature): three encoders (base, DAPT, DAPT+TAPT), hyperparameters chosen on dev for each, several
    seeds; and no searched key is also set in finetune.train, which would narrow its search to that value."""
    example = PARAMS.parent / "examples" / "own_domain" / "params.yaml"
    ft = load_config(str(example), profile, []).params.finetune
    assert ft.encoders == ["base", "adapted", "tapt"]
    searched = {"lr", "class_weight"} | ({"epochs"} if profile == "real" else set())
    assert set(ft.search.space) == searched and ft.search.trials >= 2, ft.search
    assert len(ft.train.seeds) >= (3 if profile == "real" else 2), ft.train.seeds
    raw = yaml.safe_load(example.read_text())
    written = [*raw.get("finetune", {}).get("train", {}), *raw["profiles"][profile]["finetune"].get("train", {}),
               *(k for t in raw["finetune"]["tasks"].values() for k in t.get("train_overrides", {}))]
    assert not set(written) & searched, written


def test_a_project_that_names_no_profile_runs_the_protocol(tmp_path):
    """A params file with no profile gets the field's protocol, as the example's `real` profile spells it out: TAPT
    as a third encoder (its stages in the graph), lr and epochs chosen on dev for each encoder (and class weighting
    for classification), then three seeds."""
    from bertpipe.graph.pipeline import all_stages
    from bertpipe.stages.finetune.params import spec

    (tmp_path / "params.yaml").write_text(
        "finetune:\n  tasks:\n    reviews: {type: classification, format: csv, train: r.csv}\n"
        "    names: {type: ner, format: jsonl, train: n.jsonl}\n", encoding="utf-8")
    cfg = load_config(str(tmp_path / "params.yaml"), None, [])
    assert cfg.params.profile == ""
    for task, searched in (("reviews", {"lr", "epochs", "class_weight"}), ("names", {"lr", "epochs"})):
        s = spec(cfg, task)  # what finetune/<task>/<encoder> trains with: the stage's own resolution
        assert set(s["finetune.search"].space) == searched and s["finetune.search"].trials >= 2, s["finetune.search"]
        assert all(len(v) >= 2 for v in s["finetune.search"].space.values()), s["finetune.search"].space
        assert len(s["finetune.train"].seeds) >= 3, s["finetune.train"].seeds
        assert {f"tapt/{task}", *(f"finetune/{task}/{e}" for e in ("base", "adapted", "tapt"))} <= set(all_stages(cfg))
    # the example's real run writes the same protocol: the two say the same thing
    real = load_config(str(PARAMS.parent / "examples" / "own_domain" / "params.yaml"), "real", []).params.finetune
    ft = cfg.params.finetune
    assert (ft.encoders, ft.train.seeds, ft.search.trials, ft.search.space) == (
        real.encoders, real.train.seeds, real.search.trials, real.search.space)
