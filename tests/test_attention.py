"""The attention kernels (bertpipe/infra/attention.py) on the CPU: varlen (SDPA over nested jagged tensors, its math
kernel here) and flex (FlexAttention eager, forward only here) agree with the mask for every encoder family, no
document of a packed row reads another under any of them, the loops train through them, and what is saved stays a
plain save_pretrained directory."""

from __future__ import annotations

import json

import pytest
import torch

from bertpipe.infra import attention as A
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families
from tests.families import FAMILIES, build_model

KERNELS = ("varlen", "flex")
VOCAB = 200


class _Vocab:
    """What tests.families.build_model reads of a tokenizer: its size and special ids."""

    pad_token_id, cls_token_id, sep_token_id = 1, 0, 2

    def __len__(self) -> int:
        return VOCAB


def _model(family: str):
    return build_model(family, _Vocab()).eval()


def _batch(seed: int = 0) -> dict:
    """Three rows of 16: two documents filling the first, two and padding in the second, one short document."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, 16), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 11:], mask[2, 4:] = 0, 0
    docs = mask.clone()
    docs[0, 6:], docs[1, 4:11] = 2, 2
    return {"input_ids": ids, "attention_mask": mask, "doc_ids": docs}


def _hidden(model, batch: dict, kind: str, packed: bool) -> torch.Tensor:
    b = {k: v for k, v in batch.items() if packed or k != "doc_ids"}
    with torch.no_grad(), A.kernel(model, kind, "test.attention"):
        return model_families.encoder(model)(**A.model_batch(model, A.prepare(b, kind))).last_hidden_state


def test_segment_offsets_cut_each_document_and_each_padding_run():
    docs = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    assert A.segment_offsets(docs).tolist() == [0, 2, 5, 6, 12, 13, 18]
    assert A.segment_offsets(docs).dtype == torch.int32
    # a batch of full one-document rows needs no offsets: plain SDPA is FlashAttention already
    full = {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.ones(2, 4, dtype=torch.long)}
    assert A.prepare(full, "varlen") is full and "doc_offsets" in A.prepare(_batch(), "varlen")


@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_and_flex_agree_with_the_mask(family):
    model = _model(family)
    batch = _batch()
    real = batch["attention_mask"].bool()
    for packed in (False, True):  # padded rows of one document (finetune, inference), packed documents (pretrain)
        ref = _hidden(model, batch, "mask", packed)
        for kind in KERNELS:
            out = _hidden(model, batch, kind, packed)
            assert torch.allclose(out[real], ref[real], atol=1e-5, rtol=1e-4), (kind, packed)
    assert model.config._attn_implementation == "sdpa"  # the kernel ends with its block


@pytest.mark.parametrize("family", FAMILIES)
def test_no_packed_document_reads_another_on_any_kernel(family):
    model = _model(family)
    a, b = _batch(), _batch()
    b["input_ids"][0, 6:] = torch.randint(5, VOCAB, (10,), generator=torch.Generator().manual_seed(9))  # document 2
    for kind in ("mask", *KERNELS):
        first_a = _hidden(model, a, kind, packed=True)[0, :6]
        first_b = _hidden(model, b, kind, packed=True)[0, :6]
        assert torch.allclose(first_a, first_b, atol=1e-6), kind
        assert not torch.allclose(_hidden(model, a, kind, True)[0, 6:], _hidden(model, b, kind, True)[0, 6:])


def test_a_finetune_trains_through_varlen_and_saves_a_plain_model(tmp_path):
    from transformers import AutoModel, BertConfig, BertForSequenceClassification

    from bertpipe.lib.training.loop import train
    from bertpipe.lib.training.params import TrainParams

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, num_labels=2)
    model = BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(0)
    feats = [{"input_ids": torch.randint(5, VOCAB, (int(n),), generator=g).tolist(), "labels": i % 2}
             for i, n in enumerate(torch.randint(4, 20, (16,), generator=g))]
    seen = []

    def dev(m):  # evaluation inside the run: the model runs the chosen kernel there
        seen.append(A.kind_of(m))
        return 0.0, {}

    res = train(model, feats, TrainParams(epochs=1, batch_size=4, attention="varlen", compile="off"), dev, 0, 0)
    assert res.attention == "attention: varlen" and seen == ["varlen"]
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in res.losses)
    assert model.config._attn_implementation == "sdpa"
    with A.kernel(model, "varlen", "test.attention"):  # even saved from inside a block, the config stays plain
        model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert not any("attn" in k for k in saved) and "bertpipe" not in json.dumps(saved)
    assert AutoModel.from_pretrained(tmp_path / "m").config._attn_implementation == "sdpa"


def test_one_training_step_gets_the_same_gradient_through_varlen():
    """The loop's step (prepare on the host, the document inputs through the objective) against the mask's, dropout
    off: pretraining's packed rows, and a finetune's padded batch."""
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.train import backward_step as mlm_step
    from bertpipe.lib.training.loop import backward_step as task_step

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    b = _batch()
    mlm_batch = {**b, "token_type_ids": torch.zeros_like(b["input_ids"]), "pair_labels": torch.zeros(3).long(),
                 "labels": torch.where((torch.rand(3, 16, generator=torch.Generator().manual_seed(1)) < 0.3)
                                       & b["attention_mask"].bool(), b["input_ids"], -100)}
    task_batch = {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": torch.tensor([0, 1, 1])}
    torch.manual_seed(0)
    cases = [(PretrainModel(BertForMaskedLM(cfg), pair=False), mlm_step, mlm_batch),
             (BertForSequenceClassification(cfg), task_step, task_batch)]
    for model, step, batch in cases:
        results = {}
        for kind in ("mask", "varlen"):
            model.zero_grad()
            with A.kernel(model, kind, "test.attention", training=True):
                loss = step(model.train(), [A.prepare(batch, kind)], torch.device("cpu"))
            results[kind] = loss, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        (l_mask, g_mask), (l_var, g_var) = results["mask"], results["varlen"]
        assert torch.allclose(l_mask, l_var, atol=1e-6) and torch.allclose(g_mask, g_var, atol=1e-6), type(model)


def test_flex_training_is_refused_where_it_cannot_train():
    model = _model("bert").train()
    with pytest.raises(BertpipeError, match="finetune.train.attention: flex trains only on CUDA"):
        with A.kernel(model, "flex", "finetune.train.attention", training=True):
            pass
    assert A.attention_dropout(model.config) > 0  # and on CUDA it has attention dropout, which flex lacks
    assert A.choose("auto", torch.device("cpu"), "k") == ("mask", "attention: auto, mask on cpu")
    assert A.choose("auto", torch.device("cuda"), "k")[0] == "mask"  # varlen is opt-in until a GPU measures it
