"""The vocab stage's params: how domain words are mined, which are added, and how their embeddings start."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class VocabParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Mined words added, best score first (glossary terms and [UNK] characters come on top). 0 adds none.
    top_k: int = Field(1000, ge=0, le=100_000)
    # A candidate occurs at least this often in the train split.
    min_freq: int = Field(20, ge=1)
    # Length of a candidate in pieces of the base tokenizer (characters for Chinese). 1-piece words exist already.
    max_len: int = Field(6, ge=2, le=32)
    # Ranking: "freq_pmi" = frequency x pointwise mutual information of the word's pieces (frequent and cohesive);
    # "savings" = frequency x (pieces - 1), the tokens the word saves on the train split.
    score: Literal["freq_pmi", "savings"] = "freq_pmi"
    # Candidates whose pieces co-occur less than this (natural-log PMI) are not words; dropped.
    min_pmi: float = Field(0.0, ge=-50, le=50)
    # jieba's HMM guesses words missing from its dictionary (new legal terms) at the price of some noise.
    hmm: bool = True
    # Drop common function words ("我们", "the") from the candidates.
    stopwords: bool = True
    # User glossaries (jieba user-dict format: "term [freq] [pos]" per line); their terms are always added.
    glossaries: list[str] = Field(default_factory=list)
    # Add the corpus characters the base vocab maps to [UNK] (and their ## forms; SentencePiece: the characters its
    # <unk> covers, as added tokens) when seen this often; 0 disables.
    unk_char_min_freq: int = Field(1, ge=0)
    # Mine on at most this many characters of the train split (0 = all): bounds jieba's time on big corpora.
    max_chars: int = Field(0, ge=0)
    # New embedding rows: "best" scores every init below on held-out (valid) text right after extension and keeps
    # the one with the lowest MLM loss (the report shows the comparison); or force one: mean of the base pieces'
    # rows (output bias: their mean, or the rarest piece's minus ln(pieces)), mean-and-covariance sampling, random.
    init: Literal["best", "mean", "mean_rare_bias", "mean_cov", "random"] = "best"
    # A base checkpoint without an MLM head (an encoder-only BertModel) gets a fresh head, fitted this many steps on
    # the train split with everything else frozen (batches of 16); a random head would make any MLM loss meaningless.
    head_fit_steps: int = Field(200, ge=0, le=100_000)
    # Held-out (valid) texts on which the MLM loss right after extension is compared across inits; 0 skips it
    # (init "best" then falls back to mean). eval_max_length is clamped to the model's positions.
    eval_texts: int = Field(64, ge=0, le=100_000)
    eval_max_length: int = Field(128, ge=8, le=4096)
    seed: int = 0
