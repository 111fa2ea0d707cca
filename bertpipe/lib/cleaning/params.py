"""The cleaning settings (the ``prepare.clean``, ``prepare.dedup`` and ``prepare.exclude`` params sections): how text
is normalised and filtered, what counts as a near-duplicate, and how evaluation texts are kept out of a corpus. The
prepare stage's params hold them; tapt and splits read them under the prepare stage's section names."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CleanParams(_Model):
    nfkc: bool = True  # also turns full-width ASCII into half-width
    strip_html: bool = True
    mask_urls: bool = False
    mask_emails: bool = False
    mask_phones: bool = False
    min_chars: int = Field(5, ge=0)
    max_chars: int = Field(20000, ge=1)
    # Share of CJK ideographs among ideographs + runs of other letters (a Latin word counts once; digits,
    # punctuation, emoji and spaces do not count).
    min_cjk_ratio: float = Field(0.5, ge=0.0, le=1.0)
    max_char_repeat: int = Field(10, ge=2)  # a run of one character longer than this marks junk ("哈哈哈…", "!!!!…")
    max_symbol_ratio: float = Field(0.5, ge=0.0, le=1.0)  # share of symbol/punctuation characters


class DedupParams(_Model):
    exact: bool = True
    near: bool = True
    ngram: int = Field(5, ge=1, le=32)  # character n-grams
    num_perm: int = Field(128, ge=16, le=1024)
    threshold: float = Field(0.7, gt=0.0, lt=1.0)  # Jaccard over n-gram sets
    # Candidates from LSH are checked against the true Jaccard, so reported pairs are not hash collisions.
    verify: bool = True
    # Weight of a missed pair (vs a false candidate) when choosing LSH bands x rows. Verification removes false
    # candidates cheaply, so missing pairs costs more: 0.9 finds ~98% of the pairs over the threshold on laws.db
    # where 0.5 finds ~80%.
    recall_weight: float = Field(0.9, gt=0.0, lt=1.0)
    # drop: keep one document per near-duplicate cluster; mark: keep all, the cluster keeps them in one split.
    near_action: Literal["drop", "mark"] = "drop"
    # The kept member of a cluster: earlier keys win; "-field" sorts descending. `prefer_status` ranks first.
    prefer_status: list[str] = Field(default_factory=lambda: ["现行有效"])
    keep_order: list[str] = Field(default_factory=lambda: ["-publish_date", "id"])
    seed: int = 1
    # n-grams permuted per numpy batch: the (num_perm, batch) uint64 work matrix (4 MiB at 4096) stays in cache.
    batch_ngrams: int = Field(4096, ge=64, le=1_000_000)


class ExcludeParams(_Model):
    """Keeping finetune tasks' dev/test texts out of every pretraining corpus (the `splits` stage's split files).

    A document goes when it equals a dev/test text (whitespace and case aside), is a near-duplicate of one
    (prepare.dedup's MinHash settings), or contains one of at least ``contain_min_chars`` characters verbatim."""

    tasks: bool = True
    # Shorter texts are too generic to mark a document that contains them ("本法自公布之日起施行。" is 11).
    contain_min_chars: int = Field(20, ge=1, le=10000)


class CleaningSettings(Protocol):
    """What the leak check reads: the three sections, as ``PrepareParams`` holds them."""

    clean: CleanParams
    dedup: DedupParams
    exclude: ExcludeParams
