"""The token store's workers tokenize with the Rust backend alone (tokstore.BackendTokenizer): the same ids and
whole-word indices as the transformers tokenizer the stage holds, for every tokenizer kind."""

from __future__ import annotations

import pickle

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from bertpipe.lib.textseg import tokenize_with_words
from bertpipe.stages.pretrain.tokstore import BackendTokenizer

ZH = ["中华人民共和国民法典第一条为了保护民事主体的合法权益。",
      "依照法律规定，2024年起施行，共计1260条。",
      "被告人张三犯盗窃罪，判处有期徒刑三年。Court of Appeal 维持原判", ""]
EN = ["The court of appeal upheld the judgment in 2024.", "Plaintiffs' counsel — re-filed; pre-trial motions",
      "unbelievably long-winded sentences, with commas", ""]


def _worker_copy(tok) -> BackendTokenizer:
    """What a spawned worker gets: the backend pickled and unpickled."""
    return BackendTokenizer(pickle.loads(pickle.dumps(tok.backend_tokenizer)))


def _bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE (RoBERTa's kind), trained here on the English texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(EN * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"]))
    return PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def test_backend_tokenizes_chinese_as_the_transformers_tokenizer(zh_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    expected = tokenize_with_words(ZH, tok, "zh")
    assert any(len(set(w)) < len(w) for _, w in expected)  # jieba joined characters into words
    assert tokenize_with_words(ZH, _worker_copy(tok), "zh") == expected


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_backend_tokenizes_english_as_the_transformers_tokenizer(minilm_dir, kind):
    tok = AutoTokenizer.from_pretrained(minilm_dir) if kind == "wordpiece" else _bpe_tokenizer()
    expected = tokenize_with_words(EN, tok, "en")
    assert tokenize_with_words(EN, _worker_copy(tok), "en") == expected


def test_a_backend_copied_after_a_truncating_call_does_not_truncate(zh_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    tok(ZH, truncation=True, max_length=6)  # leaves truncation set on the shared backend
    got = tokenize_with_words(ZH, _worker_copy(tok), "zh")
    assert max(len(ids) for ids, _ in got) > 6
    assert got == tokenize_with_words(ZH, AutoTokenizer.from_pretrained(zh_tokenizer_dir), "zh")
