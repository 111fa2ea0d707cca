"""DVC as its users drive it, in a temp git repo with a tiny project built once and committed to DVC, then, in file
order:

- README's `dvc exp run -S` examples edit the demo's params.yaml (DVC's own override code) and take effect;
- `dvc exp run -S KEY=VALUE` changes the effective value (the file's top-level key beats the active profile's), the
  fingerprints of exactly the stages that read the key move, `dvc exp show` has a bounded set of readable columns,
  `metrics show` / `metrics diff` see the one summary metrics file, `plots show` renders images only (offline), and
  a `--temp` experiment's runs land in the project's own MLflow store;
- a copy of the project, run with the original's code, repros one stage and leaves the original's files alone;
- a code change makes exactly the stage it belongs to, and what depends on it, stale, for every front door (last:
  it edits the project's copy of the code).

The project holds a copy of the code (bertpipe/, tasks/, flows/: a "checkout") and every command runs with that copy
on PYTHONPATH, so the code-change test can edit it.
"""

from __future__ import annotations

import csv
import io
import json
import random
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml

from bertpipe.infra.config import dvc_exp_project, dvc_exp_state
from tests.e2e_project import REPO, build_chain, copy_code, env_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PARAMS = """profile: tiny
paths: {work: work, state: .bertpipe}
model: {base: enc}
prepare:
  domain: {sources: [{path: data/corpus.txt, format: txt, name: c}]}
  general: {enabled: false}
vocab: {top_k: 20, min_freq: 2, head_fit_steps: 0, eval_texts: 8}
pretrain: {max_steps: 4, batch_size: 8, eval_every: 2, save_every: 2, eval_examples: 8, max_seq_len: 32}
finetune:
  encoders: [base]
  train: {lr: 2.0e-3, batch_size: 16, max_seq_len: 32, seeds: [7], early_stopping: {patience: 0}}
  search: {trials: 0}
  tasks:
    cls: {type: classification, format: jsonl, train: data/cls.jsonl}
evaluate: {encoder_comparison: false, bootstrap_samples: 50}
"""
# the profiles beside params.yaml (out of DVC's default params file, so `dvc exp show` has no profiles.* column)
PROFILES = """tiny:
  finetune:
    train: {epochs: 3, lr: 5.0e-2}   # lr loses to the top-level key; epochs applies
"""
STAGES = ("splits", "prepare", "vocab", "pretrain", "finetune/cls/base", "evaluate")


PROBE = "bertpipe/stages/vocab/extend.py"  # the code-change test's edit: only the vocab stage imports it
KEYS = """
import json, sys
from bertpipe.doors.cli.commands import main
sys.argv = ["bertpipe", "stages"]
try:
    main()  # `bertpipe stages` (the console script's entry): its table first
except SystemExit as e:
    assert not e.code, e.code
from bertpipe.graph.freshness import plan
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe_prefect.tasks.stages import cache_key
cfg = load_config("params.yaml")
stages = all_stages(cfg)
print(json.dumps({n: cache_key(stages[n], f.fingerprint) for n, f in plan(cfg, stages).items()}))
"""


def project_env(root: Path) -> dict:
    return {**env_for(root), "PYTHONPATH": str(root)}  # the project's copy of the code, not the repo's


def sh(cmd: list[str], root: Path, timeout: int = 900) -> str:
    proc = subprocess.run(cmd, cwd=root, env=project_env(root), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


# `dvc` commands run one after another in one process by DVC's own CLI entry (dvc.cli.main, what the `dvc` script
# calls), each one's stdout (file descriptor 1) in a file of its own: the commands that read pay DVC's import once
DVC_MANY = r"""
import json, os, sys, tempfile
from dvc.cli import main
outs = []
for argv in json.loads(sys.argv[1]):
    with tempfile.TemporaryFile("w+", encoding="utf-8") as f:
        sys.stdout.flush()
        fd1 = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            rc = main(argv)
        finally:
            sys.stdout.flush()
            os.dup2(fd1, 1)
            os.close(fd1)
        if rc != 0:
            sys.exit(f"dvc {' '.join(argv)} failed ({rc})")
        f.seek(0)
        outs.append(f.read())
print(json.dumps(outs))
"""


def dvc_many(root: Path, *commands: list[str]) -> list[str]:
    """The stdout of each `dvc` command (``["dvc", ...]``), run in one process (``DVC_MANY``)."""
    argvs = [cmd[1:] for cmd in commands]
    assert all(cmd[0] == "dvc" for cmd in commands), commands
    return json.loads(sh(["python", "-c", DVC_MANY, json.dumps(argvs)], root).splitlines()[-1])


def fingerprints(root: Path) -> dict[str, str]:
    return {s: json.loads((root / "work" / s / "manifest.json").read_text())["fingerprint"] for s in STAGES}


def stage_runs(root: Path, stage: str) -> int:
    """The MLflow runs of ``stage`` in the project's store."""
    with sqlite3.connect(root / ".bertpipe" / "mlflow.db") as db:
        query = "SELECT COUNT(*) FROM tags WHERE key = 'bertpipe.stage' AND value = ?"
        return db.execute(query, (stage,)).fetchone()[0]


def readme_commands(*prefix: str) -> list[list[str]]:
    """The command lines of README's bash code blocks that start with ``prefix``, each split as the shell splits it."""
    import re
    import shlex

    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    return [argv for block in blocks for line in block.splitlines()
            if (argv := shlex.split(line, comments=True))[:len(prefix)] == list(prefix)]


def readme_set_params() -> list[str]:
    """The values of every ``-S`` of a ``dvc exp run`` in README's code blocks."""
    return [argv[i + 1] for argv in readme_commands("dvc", "exp", "run")
            for i, a in enumerate(argv) if a in ("-S", "--set-param")]


def test_readme_set_params_apply_to_the_demo_params_file(tmp_path):
    """Each README `dvc exp run -S` edits the demo's params.yaml as DVC edits it (DVC's own override code) and sets
    the effective value, whatever the profile says."""
    from dvc.utils.hydra import apply_overrides

    from bertpipe.graph.pipeline import load_config

    overrides = readme_set_params()
    assert overrides, "README shows no dvc exp run -S"
    for name in ("params.yaml", "profiles.yaml"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    apply_overrides(tmp_path / "params.yaml", overrides)
    params = load_config(tmp_path / "params.yaml").params
    for item in overrides:
        key, value = item.lstrip("+").split("=", 1)
        node = params
        for part in key.split("."):
            node = getattr(node, part)
        assert node == yaml.safe_load(value), (item, node)


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir):
    from tests import synthetic as S

    root = tmp_path_factory.mktemp("dvcexp")
    copy_code(root)
    S.tiny_encoder(root / "enc", zh_tokenizer_dir, layers=2, hidden=64, positions=64)
    S.write_jsonl(root / "data" / "cls.jsonl", S.keyword_classification(320, seed=1))
    rng = random.Random(0)
    (root / "data" / "corpus.txt").write_text(
        "\n".join("".join(rng.choice(S.FILLER) for _ in range(40)) for _ in range(200)) + "\n", encoding="utf-8")
    (root / "params.yaml").write_text(PARAMS, encoding="utf-8")
    (root / "profiles.yaml").write_text(PROFILES, encoding="utf-8")
    (root / ".gitignore").write_text("/.bertpipe/\n", encoding="utf-8")
    probe = "import bertpipe, sys; assert bertpipe.__file__.startswith(sys.argv[1]), bertpipe.__file__"
    sh(["python", "-c", probe, str(root)], root)
    sh(["git", "init", "-q"], root)
    sh(["git", "config", "user.email", "t@example.com"], root)
    sh(["git", "config", "user.name", "t"], root)
    sh(["dvc", "init", "-q"], root)
    sh(["bertpipe", "dvc-yaml"], root)
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert "bertpipe" in dvc_yaml["params"]["deps"] and "params_effective/vocab.json" in dvc_yaml["vocab"]["deps"]
    assert not [d for d in dvc_yaml["vocab"]["deps"] if d.startswith("bertpipe")], dvc_yaml["vocab"]
    # Built in this process, then recorded as `dvc repro` records it: DVC's own runs of the stage commands are
    # what the tests below prove (`dvc exp run`, a copy's `dvc repro`), and one `dvc repro` of the whole chain is
    # test_pipeline_e2e's. The code is the repo's, the same files as the project's copy: the same fingerprints.
    build_chain(root, "evaluate")
    sh(["dvc", "commit", "-f", "-q", "--with-deps", "evaluate"], root)
    status = json.loads(sh(["dvc", "status", "--json", "--with-deps", "evaluate"], root))
    assert status == {"stages/start/dvc.yaml:start": ["always changed"]}, status  # start asks the registry each time
    # the project committed without its DVC state, which scripts/dvc_baseline.sh (demo.sh's last step) commits
    sh(["git", "add", "-A", "--", ".", ":!dvc.lock", ":!stages/*/dvc.lock"], root)
    sh(["git", "rm", "-r", "-q", "--cached", ".dvc"], root)  # `dvc init` staged its files
    sh(["git", "commit", "-qm", "project"], root)
    sh(["bash", str(REPO / "scripts" / "dvc_baseline.sh")], root)
    committed = sh(["git", "show", "--name-only", "--format=", "HEAD"], root).split()
    assert {"dvc.lock", "stages/start/dvc.lock", ".dvc/config"} <= set(committed), committed
    assert sh(["git", "status", "--porcelain", "--", "dvc.lock", "stages", ".dvc"], root) == ""
    return root


def test_exp_run_set_param_changes_effective_value_fingerprints_and_metrics(project):
    from bertpipe.graph.pipeline import load_config

    before = fingerprints(project)
    scores0 = json.loads((project / "work" / "evaluate" / "scores.json").read_text())
    assert load_config(project / "params.yaml").params.finetune.train.lr == 2e-3  # not the profile's 5e-2
    sh(["dvc", "exp", "run", "evaluate", "-S", "finetune.train.lr=1e-5", "-n", "slow-lr"], project)
    assert load_config(project / "params.yaml").params.finetune.train.lr == 1e-5
    after = fingerprints(project)
    moved = {s for s in STAGES if before[s] != after[s]}
    assert moved == {"finetune/cls/base", "evaluate"}, moved  # the stage reading the key and what is below it

    scores1 = json.loads((project / "work" / "evaluate" / "scores.json").read_text())
    assert scores1["cls.base.macro_f1"] != scores0["cls.base.macro_f1"], (scores0, scores1)
    html = project / "plots"
    shown, diff, csv_table, table, _ = dvc_many(project, ["dvc", "exp", "show", "--json"],
                                                ["dvc", "metrics", "diff", "--json"], ["dvc", "exp", "show", "--csv"],
                                                ["dvc", "metrics", "show"], ["dvc", "plots", "show", "-o", str(html)])
    shown = json.loads(shown)
    exps = [e for rev in shown for e in (rev.get("experiments") or []) if e.get("name") == "slow-lr"]
    assert exps, shown
    data = exps[0]["revs"][0]["data"]
    # the params a person sets (params.yaml's own keys), the one summary metrics file, a column per dep
    assert data["params"]["params.yaml"]["data"]["finetune"]["train"]["lr"] == 1e-5
    assert set(data["params"]) == {"params.yaml"}, data["params"]
    assert set(data["metrics"]) == {"work/evaluate/summary.json"}, data["metrics"]
    assert data["metrics"]["work/evaluate/summary.json"]["data"] == {"cls": {"macro_f1": {
        "base": scores1["cls.base.macro_f1"]}}}  # the primary metric per encoder: no interval ends, no baselines
    # the resolved values (the profile's epochs, the file's lr) and the code digest: the stage's own dep file
    effective = json.loads((project / "params_effective" / "finetune_cls_base.json").read_text())
    assert effective["params"]["finetune"]["train"]["lr"] == 1e-5 and effective["params"]["finetune"]["train"][
        "epochs"] == 3 and len(effective["code"]) == 32
    diff = json.loads(diff)
    assert "cls.macro_f1.base" in diff["work/evaluate/summary.json"], diff
    cols = csv_table.splitlines()[0].split(",")
    # bounded: params.yaml's own keys, the summary's metrics, one column per dep (hundreds when every resolved value
    # and code digest was a DVC param and every source file a dep)
    assert len(cols) <= 100 and len(cols) == len(set(cols)), (len(cols), cols)
    metric_cols = [c for c in cols if any(m in c for m in ("macro_f1", "accuracy", "ci95", "baseline"))]
    assert len(metric_cols) == 1 and metric_cols[0].endswith("cls.macro_f1.base"), metric_cols
    assert not [c for c in cols if c.startswith(("code.", "params_effective.json", "profiles."))
                and c != "profiles.yaml"], cols
    assert {"finetune.train.lr", "profiles.yaml", "bertpipe", "params_effective/finetune_cls_base.json"} <= set(cols)
    # `dvc metrics show`: one row, the summary's metrics as columns
    assert "work/evaluate/summary.json" in table and "cls.macro_f1.base" in table, table

    page = (html / "index.html").read_text()
    # images only, so the page needs no script from a CDN; the confusion matrix names its classes (the SVG: the
    # report's PNG shows class indices where no installed font draws the names, with its key in report.md, so it is
    # left out)
    assert "<script" not in page and "cdn." not in page, page[:2000]
    for plot in ("plots/images/confusion_cls_base.svg", "plots/images/curves_cls_base.png", "figures/primary.png"):
        assert plot in page, plot
    assert "figures/confusion_cls_base.png" not in page
    svg = (project / "work" / "evaluate" / "plots" / "images" / "confusion_cls_base.svg").read_text()
    labels = json.loads((project / "work" / "finetune" / "cls" / "base" / "model" / "config.json").read_text())[
        "id2label"].values()
    assert all(f">{lab}<" in svg for lab in labels), (labels, svg[:3000])


def test_readme_exp_show_is_a_readable_table_against_the_committed_baseline(project):
    """README's readable `dvc exp show`: after the experiment above, the params it set and the metrics it moved,
    against the baseline's metrics at HEAD (dvc.lock committed by scripts/dvc_baseline.sh), and no dep column; the
    table fits a terminal. `dvc metrics diff` has rows against HEAD too."""
    shown = [argv for argv in readme_commands("dvc", "exp", "show") if "--drop" in argv]
    assert len(shown) == 1, "README shows no (or more than one) `dvc exp show ... --drop`"
    argv = shown[0]
    csv_table, table, diff = dvc_many(project, [*argv, "--csv"], [*argv, "--md"],
                                      ["dvc", "metrics", "diff", "--json", "HEAD", "slow-lr"])
    rows = list(csv.DictReader(io.StringIO(csv_table)))
    cols = set(rows[0])
    assert {"finetune.train.lr", "cls.macro_f1.base"} <= cols, cols
    assert cols <= {"Experiment", "rev", "typ", "Created", "parent", "State", "Executor", "finetune.train.lr",
                    "cls.macro_f1.base"}, cols  # no dep (a path), no param the experiment left as it was
    baseline = next(r for r in rows if r["typ"] == "baseline" and r["rev"] != "workspace")  # HEAD
    exp = next(r for r in rows if r["Experiment"] == "slow-lr")
    assert float(baseline["cls.macro_f1.base"]) != float(exp["cls.macro_f1.base"])  # HEAD's metric, and the exp's
    assert float(exp["finetune.train.lr"]) == 1e-5
    assert max(len(line) for line in table.splitlines()) <= 120, table
    row = json.loads(diff)["work/evaluate/summary.json"]["cls.macro_f1.base"]
    assert (row["old"], row["new"]) == pytest.approx(  # the table rounds to 5 digits
        (float(baseline["cls.macro_f1.base"]), float(exp["cls.macro_f1.base"])), abs=1e-5), row


def test_temp_experiment_logs_to_the_project_store(project):
    # a --temp copy holds the git-tracked files only: start's own dvc.yaml and lock must be among them
    assert sh(["git", "ls-files", "stages"], project).split() == ["stages/start/dvc.lock", "stages/start/dvc.yaml"]
    n = stage_runs(project, "splits")  # the lightest stage process, under a key only it reads
    sh(["dvc", "exp", "run", "splits", "--temp", "-S", "+finetune.tasks.cls.split_seed=14"], project)
    assert stage_runs(project, "splits") == n + 1  # the run is in the project's MLflow store, not the discarded copy's


def files_of(root: Path) -> dict[str, str]:
    """sha256 of every file of the project a copy must leave alone (its outputs, generated files, DVC's lock and
    cache), bytecode caches aside."""
    import hashlib

    out = {}
    for top in ("work", "params_effective", "stages", ".dvc/cache", "dvc.yaml", "dvc.lock", "params.yaml"):
        for f in sorted([root / top] if (root / top).is_file() else (root / top).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                out[f.relative_to(root).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def test_a_copied_project_repros_a_stage_and_leaves_the_original_alone(project, tmp_path):
    """A copy of the finished project, run with the original's code (an install that is not the copy's: the case
    that failed on 'Parameters code.tasks are missing'): its dvc.yaml is current as copied, and `dvc repro` of one
    stage (prepare: one of the lightest with a stage above it) after a params edit rebuilds that stage alone in the
    copy; the original's files stay as they were."""
    import shutil

    before = files_of(project)
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True, ignore=shutil.ignore_patterns("tmp"))
    env = {**project_env(copy), "PYTHONPATH": str(project)}  # the original's code runs

    def in_copy(cmd: list[str]) -> str:
        proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{cmd}: {proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    assert "are current" in in_copy(["bertpipe", "dvc-yaml", "--check"])
    params = yaml.safe_load((copy / "params.yaml").read_text())
    params["prepare"]["split"] = {"valid": 0.2}
    (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    fp = json.loads((copy / "work" / "prepare" / "manifest.json").read_text())["fingerprint"]
    out = in_copy(["dvc", "repro", "prepare"])
    assert "Running stage 'prepare'" in out and "Running stage 'splits'" not in out, out[-3000:]
    assert json.loads((copy / "work" / "prepare" / "manifest.json").read_text())["fingerprint"] != fp
    assert files_of(project) == before


def test_state_dir_of_a_temp_experiment_copy(tmp_path):
    copy = tmp_path / "proj" / ".dvc" / "tmp" / "exps" / "tmpab12"
    assert dvc_exp_state(copy, copy / ".bertpipe") == tmp_path / "proj" / ".bertpipe"
    assert dvc_exp_state(tmp_path, tmp_path / ".bertpipe") == tmp_path / ".bertpipe"
    assert dvc_exp_state(copy, Path("/srv/state")) == Path("/srv/state")
    assert dvc_exp_project(copy / "sub") == tmp_path / "proj" and dvc_exp_project(tmp_path) == tmp_path


def look(root: Path) -> tuple[dict, dict, set]:
    """(`bertpipe stages` states, Prefect cache keys, stages `dvc status` reports); the first two from one process
    (``KEYS``)."""
    *table, keys = sh(["python", "-c", KEYS], root).strip().splitlines()
    states = {ln.split()[0]: ln.split()[1] for ln in table if ln.strip()}
    return states, json.loads(keys), dvc_status(root)


def dvc_status(root: Path) -> set:
    return set(json.loads(sh(["dvc", "status", "--json"], root) or "{}"))


def test_a_code_change_stales_its_stage_and_dependants_only(project):
    """A code line appended to the copy's bertpipe/stages/vocab/extend.py, which only the vocab stage imports:

    - `bertpipe stages`: vocab and the built stages below it turn stale; the other built stages stay fresh;
    - the Prefect cache keys (the expected fingerprints) change for vocab and every stage below it in the graph,
      built or not, and for no other stage;
    - `dvc status` (the generated dvc.yaml lists the code folder as a dep of the `params` stage, which writes each
      stage's code digest into its file under params_effective/) reports `params` changed and no other stage; after
      `dvc repro params` it reports vocab and no other stage (DVC reruns what is below at `dvc repro` time, once
      vocab's output changes). A comment edit (the digest is of the syntax tree) leaves every stage but `params`
      unchanged."""
    from bertpipe.graph.pipeline import all_stages, upstream
    from bertpipe.graph.pipeline import load_config

    root = project
    built = {"splits", "prepare", "start", "vocab", "pretrain", "finetune/cls/base", "evaluate"}
    states0, keys0, dvc0 = look(root)
    assert {n for n, s in states0.items() if s == "fresh"} == built, states0
    # (start is always_changed: DVC reports it changed every time, as it asks the registry every repro)
    assert not dvc0 & {n.replace("/", "_") for n in built - {"start"}}, dvc0
    manifest = json.loads((root / "work" / "vocab" / "manifest.json").read_text())
    assert PROBE in manifest["code"]["files"] and "torch" in manifest["code"]["libs"]

    with open(root / PROBE, "a", encoding="utf-8") as f:
        f.write("\n# a comment moves no code digest\n")
    assert dvc_status(root) - dvc0 == {"params"}
    sh(["dvc", "repro", "params"], root)
    assert dvc_status(root) - dvc0 == set()

    with open(root / PROBE, "a", encoding="utf-8") as f:
        f.write("\nCODE_STALENESS_PROBE = 1\n")
    states1, keys1, dvc1 = look(root)

    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    below = {"vocab"}
    for name in stages:  # graph order: a stage is below vocab when one of its upstream stages is
        if set(upstream(name, cfg, stages)) & below:
            below.add(name)
    # export/encoder and register (the adapted encoder alone: encoders: [base]): below vocab and never built here
    assert {"pretrain", "export/encoder", "evaluate", "register"} <= below
    assert "finetune/cls/base" not in below and "prepare" not in below

    turned_stale = {n for n in built if states1[n] == "stale"}
    assert turned_stale == built & below == {"vocab", "pretrain", "evaluate"}, states1
    assert {n for n in built if states1[n] == "fresh"} == built - below
    assert set(keys0) == set(keys1) == set(stages)
    assert "waiting" not in set(states0.values()) | set(states1.values()), (states0, states1)
    assert {n for n in stages if keys0[n] != keys1[n]} == below, (keys0, keys1)
    # DVC learns which stages the edit touches when the params stage reruns (it writes the code digests)
    assert dvc1 - dvc0 == {"params"}, (dvc0, dvc1)
    sh(["dvc", "repro", "params"], root)
    assert dvc_status(root) - dvc0 == {"vocab"}
