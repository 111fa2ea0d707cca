"""The vocab stage's declaration (see ``bertpipe.core.declared``): domain words mined, the tokenizer extended."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.layout import base_model, base_tokenizer, corpus_dir, encoder_paths, read_start, start_file
from bertpipe.stages.vocab.params import VocabParams

VERSION = "2"


def own_inputs(cfg) -> dict:
    """The glossary files vocab.glossaries names, keyed ``glossary:<index>``."""
    return {f"glossary:{i}": cfg.path(g) for i, g in enumerate(cfg.params.vocab.glossaries)}


def vocab_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        # The encoder to extend: the base, or the champion when new data arrived, as the start stage wrote it
        # (a file: walking the graph asks nothing of the registry).
        model, tokenizer = encoder_paths(read_start(start_file(cfg)), base_model(cfg), base_tokenizer(cfg))
        return {
            "corpus": corpus_dir(cfg, "domain"),
            "start": start_file(cfg),
            "model": model,
            "tokenizer": tokenizer,
            **own_inputs(cfg),
        }

    return Stage("vocab", VERSION, ("vocab", "model.language"), inputs, lambda c: c.work / "vocab",
                 deferred("bertpipe.stages.vocab.stage:build"), params_section="vocab", code=("vocab",),
                 libs=(*MODEL_LIBS, "jieba"))


VOCAB = Family("vocab", "Mine domain words, extend the tokenizer and initialise the new embeddings.",
               lambda c: [vocab_stage()], params={"vocab": VocabParams})
