"""MLM (pretrain) and NER (finetune) losses are normalised by the target tokens of the whole optimizer step: one big
batch and the same examples cut into micro-batches (and, for MLM, DDP ranks) with unequal target counts give the same
gradient."""

from __future__ import annotations

import pytest
import torch

from bertpipe.lib.mlm.masking import IGNORE
from bertpipe.lib.mlm.model import PretrainModel
from bertpipe.lib.mlm.train import Dist
from bertpipe.lib.mlm.train import backward_step as pretrain_step
from bertpipe.lib.training.loop import backward_step as finetune_step

torch.set_num_threads(1)


def _config():
    from transformers import BertConfig

    return BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=5)


def _batch(targets_per_row: list[int], n_labels: int, ignore: int) -> dict:
    g = torch.Generator().manual_seed(0)
    rows, width = len(targets_per_row), 12
    labels = torch.full((rows, width), ignore, dtype=torch.long)
    for r, k in enumerate(targets_per_row):
        labels[r, 1 : 1 + k] = torch.randint(0, n_labels, (k,), generator=g)
    return {"input_ids": torch.randint(5, 50, (rows, width), generator=g),
            "attention_mask": torch.ones(rows, width, dtype=torch.long),
            "token_type_ids": torch.zeros(rows, width, dtype=torch.long), "labels": labels}


def _cut(batch: dict, at: int) -> list[dict]:
    return [{k: v[:at] for k, v in batch.items()}, {k: v[at:] for k, v in batch.items()}]


def _grads(model) -> torch.Tensor:
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return g


ROWS = [1, 1, 5, 6]  # 2 targets in the first micro-batch, 11 in the second


def test_mlm_accumulated_micro_batches_match_one_big_batch():
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    mlm = BertForMaskedLM(_config())
    pm = PretrainModel(mlm, pair=False)
    batch = _batch(ROWS, 50, IGNORE)
    batch["pair_labels"] = torch.zeros(len(ROWS), dtype=torch.long)
    # Reference: the mean cross-entropy over every masked token of the whole batch, from the plain model.
    logits = mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    sel = batch["labels"] != IGNORE
    torch.nn.functional.cross_entropy(logits[sel], batch["labels"][sel]).backward()
    ref = _grads(mlm)

    pretrain_step(pm, [batch], Dist())
    assert torch.allclose(_grads(pm), ref, atol=1e-6)
    pretrain_step(pm, _cut(batch, 2), Dist())
    assert torch.allclose(_grads(pm), ref, atol=1e-6)
    # The old way (each micro-batch's mean, averaged) weighs the 2 tokens of the first micro-batch like the 11 of the
    # second: a different gradient, so the comparison above can fail.
    for b in _cut(batch, 2):
        (pm(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"])["loss"] / 2).backward()
    assert not torch.allclose(_grads(pm), ref, atol=1e-4)


def test_ner_accumulated_micro_batches_match_one_big_batch():
    from transformers import BertForTokenClassification

    torch.manual_seed(0)
    model = BertForTokenClassification(_config())
    batch = _batch(ROWS, 5, -100)
    model(**batch).loss.backward()  # transformers' own loss on the whole batch: mean over labelled tokens
    ref = _grads(model)
    losses = finetune_step(model, _cut(batch, 2), torch.device("cpu"))
    assert torch.allclose(_grads(model), ref, atol=1e-6)
    assert len(losses) == 2 and all(x > 0 for x in losses)
    for b in _cut(batch, 2):
        (model(**b).loss / 2).backward()
    assert not torch.allclose(_grads(model), ref, atol=1e-4)


def _ddp_rank(rank: int, world: int, init: str, out: str) -> None:
    """One of two gloo processes: its rows of the batch, in two micro-batches, under DDP."""
    import torch.distributed as dist
    from transformers import BertForMaskedLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    pm = PretrainModel(BertForMaskedLM(_config()), pair=False)
    ddp = torch.nn.parallel.DistributedDataParallel(pm)
    batch = _batch(ROWS, 50, IGNORE)
    batch["pair_labels"] = torch.zeros(len(ROWS), dtype=torch.long)
    mine = {k: v[2 * rank : 2 * rank + 2] for k, v in batch.items()}  # rank 0: 2 masked tokens, rank 1: 11
    pretrain_step(ddp, _cut(mine, 1), Dist(rank, world))
    if rank == 0:
        torch.save(_grads(pm), out)
    # Free DDP's reducer while the process group is alive (as pretrain.stage does): destroyed after it, the reducer
    # holds the group's last reference, and its teardown deadlocks joining gloo's worker thread on the GIL.
    del ddp, pm
    dist.destroy_process_group()


@pytest.mark.slow  # two gloo processes
def test_mlm_across_ddp_ranks_matches_one_big_batch(tmp_path):
    import torch.multiprocessing as mp
    from transformers import BertForMaskedLM

    torch.manual_seed(0)
    mlm = BertForMaskedLM(_config())
    batch = _batch(ROWS, 50, IGNORE)
    logits = mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    sel = batch["labels"] != IGNORE
    torch.nn.functional.cross_entropy(logits[sel], batch["labels"][sel]).backward()
    ref = _grads(mlm)
    out = tmp_path / "grads.pt"
    mp.spawn(_ddp_rank, args=(2, f"file://{tmp_path / 'init'}", str(out)), nprocs=2, join=True)
    assert torch.allclose(torch.load(out), ref, atol=1e-6)
