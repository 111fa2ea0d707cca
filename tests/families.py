"""Tiny local checkpoints of each encoder family, since no weights can be downloaded here.

Each is a save_pretrained directory (model + tokenizer) that the Auto classes load offline: random weights from the
family's config class, and a real tokenizer of the family's kind: the real bert-base-chinese WordPiece vocab for the
WordPiece families, a byte-level BPE (RoBERTa) or a SentencePiece Unigram (XLM-R, ALBERT) trained with the
``tokenizers`` library on the bundled corpora (Chinese law articles plus English prose, so mixed text has pieces of
both scripts). ``build_family(name, out, raw)`` writes one; ``FAMILIES`` lists them; the session fixture ``family_dirs``
(import it into a test module) builds them all once. Used by tests/test_families.py and the RTD objective's tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

FAMILIES = ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra")
TOKENIZER_KIND = {"bert": "wordpiece", "distilbert": "wordpiece", "electra": "wordpiece", "roberta": "bpe",
                  "xlm-roberta": "sentencepiece", "albert": "sentencepiece"}
TINY = {"hidden": 32, "layers": 1, "heads": 2, "intermediate": 64, "positions": 130, "embedding": 16}
SEQ_LEN = 64  # what the tiny chain uses; every family's position table allows it


def corpus(raw: Path, n_zh: int = 600) -> list[str]:
    """Real text to train the tokenizers on: law articles and English paragraphs."""
    from tests.corpus import law_texts
    from tests.test_pretrain_support import english_texts

    return law_texts(raw, n_zh) + english_texts()


def _wordpiece(name: str, raw: Path):
    from transformers import AutoTokenizer, BertTokenizerFast, DistilBertTokenizerFast, ElectraTokenizerFast

    base = AutoTokenizer.from_pretrained(str(raw / "bert-base-chinese"))
    cls = {"bert": BertTokenizerFast, "distilbert": DistilBertTokenizerFast, "electra": ElectraTokenizerFast}[name]
    specials = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")
    return cls(tokenizer_object=base.backend_tokenizer, **specials)


def _bpe(texts: list[str], vocab_size: int):
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import RobertaTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                            show_progress=False)
    backend = tok._tokenizer
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                          add_prefix_space=False)
    return RobertaTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>")


def _sentencepiece(name: str, texts: list[str], vocab_size: int):
    from tokenizers import SentencePieceUnigramTokenizer, processors
    from transformers import AlbertTokenizerFast, XLMRobertaTokenizerFast

    if name == "albert":
        specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
        cls_tok, sep_tok, pad, unk, mask = "[CLS]", "[SEP]", "<pad>", "<unk>", "[MASK]"
    else:
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        cls_tok, sep_tok, pad, unk, mask = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
    tok = SentencePieceUnigramTokenizer()
    tok.train_from_iterator(texts, vocab_size=vocab_size, special_tokens=specials, unk_token=unk,
                            show_progress=False)
    backend = tok._tokenizer
    ids = {t: backend.token_to_id(t) for t in specials}
    if name == "albert":
        backend.post_processor = processors.TemplateProcessing(
            single=f"{cls_tok}:0 $A:0 {sep_tok}:0", pair=f"{cls_tok}:0 $A:0 {sep_tok}:0 $B:1 {sep_tok}:1",
            special_tokens=[(cls_tok, ids[cls_tok]), (sep_tok, ids[sep_tok])])
        return AlbertTokenizerFast(tokenizer_object=backend, cls_token=cls_tok, sep_token=sep_tok, pad_token=pad,
                                   unk_token=unk, mask_token=mask, bos_token=cls_tok, eos_token=sep_tok)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_tok} $A {sep_tok}", pair=f"{cls_tok} $A {sep_tok} {sep_tok} $B {sep_tok}",
        special_tokens=[(cls_tok, ids[cls_tok]), (sep_tok, ids[sep_tok])])
    return XLMRobertaTokenizerFast(tokenizer_object=backend, bos_token=cls_tok, eos_token=sep_tok, sep_token=sep_tok,
                                   cls_token=cls_tok, unk_token=unk, pad_token=pad, mask_token=mask)


def build_tokenizer(name: str, raw: Path, texts: list[str] | None = None, vocab_size: int = 2000):
    kind = TOKENIZER_KIND[name]
    if kind == "wordpiece":
        return _wordpiece(name, raw)
    texts = texts if texts is not None else corpus(raw)
    return _bpe(texts, vocab_size) if kind == "bpe" else _sentencepiece(name, texts, vocab_size)


def build_model(name: str, tok):
    """Random weights of the family's usual pretrained class (ELECTRA: the discriminator, without an MLM head)."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    t = TINY
    common = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    bert_like = dict(hidden_size=t["hidden"], num_hidden_layers=t["layers"], num_attention_heads=t["heads"],
                     intermediate_size=t["intermediate"], max_position_embeddings=t["positions"], **common)
    if name == "bert":
        return tf.BertForMaskedLM(tf.BertConfig(**bert_like))
    if name == "roberta":
        return tf.RobertaForMaskedLM(tf.RobertaConfig(type_vocab_size=1, bos_token_id=0, eos_token_id=2, **bert_like))
    if name == "xlm-roberta":
        return tf.XLMRobertaForMaskedLM(tf.XLMRobertaConfig(type_vocab_size=1, bos_token_id=tok.cls_token_id,
                                                            eos_token_id=tok.sep_token_id, **bert_like))
    if name == "albert":
        return tf.AlbertForMaskedLM(tf.AlbertConfig(embedding_size=t["embedding"], **bert_like))
    if name == "electra":
        return tf.ElectraForPreTraining(tf.ElectraConfig(embedding_size=t["embedding"], **bert_like))
    if name == "distilbert":
        return tf.DistilBertForMaskedLM(tf.DistilBertConfig(
            dim=t["hidden"], n_layers=t["layers"], n_heads=t["heads"], hidden_dim=t["intermediate"],
            max_position_embeddings=t["positions"], **common))
    raise ValueError(f"unknown family {name!r} (have {FAMILIES})")


def build_family(name: str, out: Path, raw: Path, texts: list[str] | None = None) -> Path:
    """A save_pretrained dir at ``out`` with a tiny random ``name`` model and its family's tokenizer."""
    tok = build_tokenizer(name, raw, texts)
    model = build_model(name, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory, sample_raw) -> dict[str, Path]:
    """{family: save_pretrained dir} for every family, built once per session (~15 s, most of it SentencePiece)."""
    root = tmp_path_factory.mktemp("families")
    texts = corpus(sample_raw)
    return {name: build_family(name, root / name, sample_raw, texts) for name in FAMILIES}
