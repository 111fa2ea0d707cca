"""The one training loop (bertpipe.lib.training.trainloop) with a stage-free objective: a linear regression fed by a
pure function of the step. What every stage gets from it: a resumed run replays the steps of an uninterrupted one,
early stopping keeps the best evaluation, and progress into a log file is not a line per step."""

from __future__ import annotations

import torch

from bertpipe.lib.training.trainloop import FP32, Objective, Plan, run

torch.set_num_threads(1)


class Squares(Objective):
    def shares(self, micro_batches, d):
        return [lambda out: out / len(micro_batches)] * len(micro_batches)

    def forward(self, model, batch):
        return ((model(batch["x"]).squeeze(-1) - batch["y"]) ** 2).mean()

    def logged(self, out):
        return out.detach()


def feed(step: int):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(2, 8, 3, generator=g)
    return [{"x": x[k], "y": x[k].sum(-1), "attention_mask": torch.ones(8)} for k in range(2)], None


def _run(scratch, total: int, evaluate=None, plan_kw=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    evaluate = evaluate or (lambda step: (-float(model.weight.sum()), {"w": float(model.weight.sum())}))
    plan = Plan(total, eval_every=2, log_every=1, save_every=2, **(plan_kw or {}))
    return model, run(model, opt, sched, feed, Squares(), evaluate, plan, FP32, scratch=scratch, desc="toy")


def test_a_resumed_run_replays_the_uninterrupted_steps(tmp_path):
    whole, res = _run(tmp_path / "a", 8)
    _run(tmp_path / "b", 4)  # a run that ended (was killed) after its step-4 checkpoint
    resumed, again = _run(tmp_path / "b", 8)
    assert again.resumed_from == 4 and again.step == 8 and res.step == 8
    assert torch.equal(resumed.weight, whole.weight) and torch.equal(resumed.bias, whole.bias)
    assert [h["loss"] for h in again.history if "loss" in h] == [h["loss"] for h in res.history if "loss" in h]


def test_early_stopping_keeps_the_best_evaluation(tmp_path):
    scores = iter([0.5, 0.9, 0.8, 0.7, 0.6])
    _, res = _run(None, 20, evaluate=lambda step: (next(scores), {}), plan_kw={"patience": 2})
    assert res.stopped == "early_stop" and res.step == 8  # evaluations at 2, 4 (best), 6, 8
    assert res.best["step"] == 4 and res.best["score"] == 0.9


def test_progress_into_a_file_is_not_a_line_per_step(tmp_path, capfd):
    _run(None, 200)
    updates = capfd.readouterr().err.count("\r")
    assert updates < 20, updates  # a bar redrawn at most every 2 s, not once per step
