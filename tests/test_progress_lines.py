"""Progress in a log file: a stage command whose stderr is a file writes whole lines (no carriage-return redraws,
a few hundred bytes a stage); the flow's relay of a stage process writes its log file the same way and names the
stage once per line in the task run's log."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest

from bertpipe.infra.progress import Lines
from tests import synthetic as S
from tests.e2e_project import env_for, invoke


def test_lines_pass_whole_lines_and_a_bar_once_per_interval():
    now = [0.0]
    out: list[str] = []
    lines = Lines(out.append, every_s=10.0, clock=lambda: now[0])
    lines.feed("[finetune/t] starting\n")
    for step in range(1, 6):  # tqdm: "\r" + drawing, the drawing ended by the next "\r"
        lines.feed(f"\rtrain  {step}/5 steps")
        now[0] += 3.0
    lines.feed("\r" + " " * 30 + "\r")  # a bar that erases itself on close (leave=False)
    lines.feed("[finetune/t] done\r")
    lines.feed("\n")  # a "\r\n" split between two writes ends one line
    lines.feed("no newline at the end")
    lines.close()
    # the first drawing at once, the next one 10 s later; the erase goes nowhere
    assert out == ["[finetune/t] starting", "train  1/5 steps", "train  5/5 steps", "[finetune/t] done",
                   "no newline at the end"]


@pytest.mark.slow
def test_a_stage_command_with_stderr_to_a_file_writes_whole_lines(tmp_path, zh_tokenizer_dir):
    root = tmp_path / "p"
    root.mkdir()
    base = S.tiny_encoder(root / "enc", zh_tokenizer_dir, layers=1, hidden=32, seed=0)
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(120, labels=("pos", "neg")))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: .bertpipe}}
model: {{base: {base}}}
tracking: {{uri: none}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 3, batch_size: 8, max_seq_len: 32, seeds: [1], early_stopping: {{patience: 0}}}}
  search: {{trials: 0}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
""", encoding="utf-8")
    env = env_for(root, prefect="ephemeral")
    assert invoke(["splits"], root, env).returncode == 0
    log = tmp_path / "finetune.log"
    with open(log, "wb") as err:  # the console script as a user runs it: `bertpipe finetune ... 2> finetune.log`
        proc = subprocess.run([sys.executable, "-m", "bertpipe", "finetune", "--task", "cls", "--encoder", "base"],
                              cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err, timeout=600)
    text = log.read_bytes().decode("utf-8")  # as written: no newline translation
    assert proc.returncode == 0, text[-3000:]
    lines = text.splitlines()
    assert "\r" not in text and len(text) < 20_000, (len(text), text[:2000])
    assert any(line.startswith("[finetune/cls/base] ") for line in lines), lines
    assert not any(line.startswith("[finetune/cls/base] [finetune/cls/base]") for line in lines)
    assert max(map(len, lines)) < 400 and sum("step/s" in line or "s/step" in line for line in lines) <= 10, lines


def test_the_flows_relay_writes_lines_and_names_the_stage_once(tmp_path, monkeypatch):
    """A stage process that redraws a bar 2,000 times (tqdm with no minimum interval): its log file holds whole
    lines, and each line reaches the task run's log with one ``[stage]`` prefix."""
    from bertpipe_prefect.tasks import stages

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logger = logging.getLogger("test_progress_lines.relay")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    monkeypatch.setattr(stages, "_run_logger", lambda: logger)  # the Prefect task run's logger, outside a flow
    child = ("import sys\nfrom tqdm import tqdm\nprint('[finetune/t/base] starting', file=sys.stderr, flush=True)\n"
             "for _ in tqdm(range(2000), file=sys.stderr, mininterval=0, miniters=1, desc='train'): pass\n"
             "print('[finetune/t/base] done', file=sys.stderr)\nprint('a line of its own')\n")
    log = io.BytesIO()
    with subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        stages._relay(proc.stdout, log, "finetune/t/base")
    text = log.getvalue().decode("utf-8")
    assert "\r" not in text and len(text.splitlines()) < 10, text
    assert text.startswith("[finetune/t/base] starting\n") and "[finetune/t/base] done\n" in text
    assert records[0] == "[finetune/t/base] starting" and "[finetune/t/base] a line of its own" in records
    assert not any(r.startswith("[finetune/t/base] [finetune/t/base]") for r in records), records
    assert any(r.startswith("[finetune/t/base] train:") for r in records), records
