"""The hyperparameters of a finetuning run (``TrainParams``, the search over them) and a finetune task's definition
(``TaskParams``): the models every stage that trains, scores or reads a task validates its settings with.

Their place in params.yaml is the finetune stage's (``finetune.train``, ``finetune.search``, ``finetune.tasks.<task>``,
see ``bertpipe.stages.finetune.params``); distill's ``train_overrides`` are ``TrainOverrides`` too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from bertpipe.infra.switches import AttentionSetting, CompileSetting


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EarlyStopping(_Strict):
    # Evaluations without an improvement of the dev primary metric before training stops; 0 disables stopping.
    # The best checkpoint is restored either way.
    patience: int = Field(2, ge=0, le=100, strict=True)
    min_delta: float = Field(0.0, ge=0.0, le=1.0)


class UnfreezePhase(_Strict):
    """One phase of gradual unfreezing: train the head plus the top ``top_layers`` encoder layers for ``epochs``.

    ``top_layers: 0`` trains the head only; ``-1`` trains everything (embeddings included). After the listed phases,
    the remaining epochs train everything.
    """

    epochs: float = Field(1.0, gt=0.0, le=100.0)
    top_layers: int = Field(0, ge=-1, le=1000, strict=True)


class TrainParams(_Strict):
    lr: float = Field(3e-5, gt=0.0, le=1.0)  # recipes: 2e-5..5e-5 for base-size encoders
    head_lr: float = Field(0.0, ge=0.0, le=1.0)  # 0: same as lr; freshly initialised heads often like more
    epochs: float = Field(3.0, gt=0.0, le=100.0)
    batch_size: int = Field(32, ge=1, le=4096, strict=True)
    grad_accum: int = Field(1, ge=1, le=1024, strict=True)
    warmup_ratio: float = Field(0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    max_grad_norm: float = Field(1.0, ge=0.0, le=1000.0)  # 0 disables clipping
    # Layer-wise lr decay: layer i of L gets lr * decay^(L - i), embeddings lr * decay^(L + 1); 1.0 disables it.
    layer_lr_decay: float = Field(1.0, gt=0.0, le=1.0)
    # Three seeds: a score is a mean over them, and the verdict says whether they agree on the sign of a difference.
    seeds: list[StrictInt] = Field(default_factory=lambda: [1, 2, 3], min_length=1, max_length=20)
    early_stopping: EarlyStopping = Field(default_factory=EarlyStopping)
    unfreeze: list[UnfreezePhase] = Field(default_factory=list, max_length=20)
    evals_per_epoch: int = Field(1, ge=1, le=100, strict=True)
    # auto: bf16 where the device has bf16 units, fp16 + GradScaler on older GPUs, fp32 elsewhere
    # (bertpipe/infra/device.py)
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    max_seq_len: int = Field(256, ge=16, le=8192, strict=True)
    eval_batch_size: int = Field(64, ge=1, le=4096, strict=True)
    # Caps for demos and smoke runs (0 = no cap): a deterministic sample per split, drawn before tokenisation.
    max_train_examples: int = Field(0, ge=0, strict=True)
    max_eval_examples: int = Field(0, ge=0, strict=True)
    num_threads: int = Field(0, ge=0, le=1024, strict=True)  # torch intra-op threads; 0: bertpipe.infra.cores's share
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # Class imbalance (classification): the loss weights each class by n / (k * count) (balanced), by the square root
    # of that (sqrt), or not at all (none). NER and QA train unweighted whatever this says.
    class_weight: Literal["none", "balanced", "sqrt"] = "none"
    # torch.compile (Inductor) of the training forward: on, off, or auto = only a run of
    # execution.FINETUNE_AUTO_MIN_STEPS planned optimizer steps or more that can repay the compile time, and only
    # where a compiler exists (C++ on the CPU, Triton on CUDA). Evaluation and scoring run the eager model. An
    # unquoted on/off means the word written.
    compile: CompileSetting = "auto"
    # the attention kernel keeping each row to its real tokens: auto (mask until a GPU check measures varlen ahead), mask (the
    # padding mask), varlen (FlashAttention's variable-length kernel) or flex (FlexAttention; no attention dropout).
    # Evaluation and scoring run auto (bertpipe/infra/attention.py).
    attention: AttentionSetting = "auto"

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v: list[int]) -> list[int]:
        twice = sorted({s for s in v if v.count(s) > 1})
        if twice:
            raise ValueError(f"seed(s) {twice} listed more than once; each seed is one run")
        return v


def _known_train_keys(v: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(v) - set(TrainParams.model_fields))
    if unknown:
        raise ValueError(f"unknown finetune.train key(s) {unknown}")
    TrainParams.model_validate(v)  # as the model it becomes part of: refused here, not when a stage applies it
    return v


# Overrides of finetune.train (a task's, or distill's for the student): only its keys, applied by with_overrides.
TrainOverrides = Annotated[dict[str, Any], AfterValidator(_known_train_keys)]


def with_overrides(shared: TrainParams, overrides: dict[str, Any]) -> TrainParams:
    """The shared hyperparameters with ``overrides`` applied (validated like the shared section)."""
    return TrainParams.model_validate({**shared.model_dump(), **overrides}) if overrides else shared


# finetune.train keys the stage applies once, before any trial: a value in the space would change nothing
_BEFORE_SEARCH = {"max_seq_len": "the splits are featurised once", "max_train_examples": "the splits stage caps train",
                  "precision": "dev is scored at the stage's precision"}


# The search a project gets unless it names one: 3 lr x 2 epochs x 2 class weightings (NER and QA: the 6 without)
DEFAULT_SPACE = {"lr": (2e-5, 3e-5, 5e-5), "epochs": (3, 4), "class_weight": ("none", "balanced")}


class SearchParams(_Strict):
    """Hyperparameters chosen on dev, per task and encoder: every encoder gets the same space and budget.

    ``space`` maps finetune.train keys to the values to try; each trial is finetune.train (with the task's
    overrides) plus one value per key, trained on the first seed and scored on dev after every evaluation.
    Successive halving stops a trial whose dev score at an evaluation ranks in the bottom of the trials seen there;
    a degenerate trial (one class, no entity, or not above the majority baseline on dev) never wins. ``trials: 0``
    trains the given hyperparameters without a search. A space no larger than ``trials`` is tried in full (a
    grid); a larger one is sampled (TPE).

    The defaults are the protocol of Gururangan et al. (2020) for base-size encoders: lr and epochs chosen on dev
    (and class weighting, for classification), the full grid of 12 trials (``DEFAULT_SPACE``).
    """

    trials: int = Field(12, ge=0, le=1000, strict=True)
    space: dict[str, list[Any]] = Field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_SPACE.items()})
    prune: bool = True
    min_evals: int = Field(1, ge=1, le=1000, strict=True)  # dev evaluations a trial gets before it can be stopped
    reduction_factor: int = Field(2, ge=2, le=10, strict=True)
    seed: int = Field(0, strict=True)
    # A seed whose run is degenerate is trained again with another seed (seed + 1000 * k), at most this often.
    retries: int = Field(1, ge=0, le=10, strict=True)

    @field_validator("space")
    @classmethod
    def _known_keys(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            if key not in TrainParams.model_fields or key in ("seeds", "device", "num_threads", "early_stopping",
                                                              "unfreeze", "max_eval_examples", "eval_batch_size",
                                                              "compile", "attention"):
                raise ValueError(f"space: {key!r} is not a finetune.train hyperparameter to search")
            if key in _BEFORE_SEARCH:
                raise ValueError(f"space: {key!r} is applied before the search ({_BEFORE_SEARCH[key]}), so every "
                                 "trial would run with the value finetune.train gives; set it there")
            if not isinstance(values, list) or not values:
                raise ValueError(f"space.{key}: a non-empty list of values to try")
            for value in values:  # each value must make a valid finetune.train
                TrainParams.model_validate({key: value})
        return v


# TaskParams fields that say how examples are fed to a model (truncation, windows, QA spans): read by finetune and
# what scores its models, never by the splits stage.
FEEDING = ("truncation", "head_tokens", "stride", "window_aggregate", "label_all_pieces", "doc_stride",
           "max_query_len", "max_answer_len", "n_best")


class TaskParams(_Strict):
    type: Literal["classification", "pair_classification", "ner", "qa"]
    # jsonl | csv | tsv | conll | squad (SQuAD/CMRC JSON) | sqlite (`query`) | lines (`label_files`: one text a line)
    format: Literal["jsonl", "csv", "tsv", "conll", "squad", "sqlite", "lines"]
    train: str = ""  # file; paths resolve against the params file's directory
    dev: str = ""  # empty: split off train deterministically
    test: str = ""
    label_files: dict[str, str] = Field(default_factory=dict)  # format lines: {label: file}
    query: str = ""  # format sqlite: SELECT returning the text/label/(group) fields on `train`
    # Field names (jsonl/csv/sqlite), and column indexes for CoNLL.
    text_field: str = "text"
    text_pair_field: str = "text_pair"
    label_field: str = "label"
    group_field: str = ""  # rows sharing a group land in the same split (e.g. articles of one law)
    id_field: str = "id"
    tokens_field: str = "tokens"  # jsonl NER: either tokens + tags ...
    tags_field: str = "tags"
    spans_field: str = "spans"  # ... or text + spans [{start, end, label}] (end exclusive)
    conll_token_col: int = Field(0, ge=0)
    conll_tag_col: int = -1
    conll_columns: int = Field(0, ge=0)  # expected columns per line; 0: any count >= 2, but the same on every line
    # How CoNLL tokens are joined into the text whose character spans predictions refer to. auto: no separator when
    # every token of the sentence is one character (MSRA), else a space except between two CJK characters.
    conll_join: Literal["auto", "space", "none"] = "auto"
    # Splitting when dev/test are not given: stratified by label, by group when group_field is set.
    dev_ratio: float = Field(0.1, ge=0.0, lt=1.0)
    test_ratio: float = Field(0.1, ge=0.0, lt=1.0)
    split_seed: int = 13
    dedup: bool = False  # drop exact duplicate texts (first kept)
    drop_conflicts: bool = False  # drop texts that occur with more than one label
    min_chars: int = Field(1, ge=0)  # shorter texts are empty input: dropped and counted (0 keeps empty texts)
    unknown_label: Literal["error", "map"] = "error"  # a dev/test label unseen in train
    unknown_label_name: str = "<unk>"
    # NER
    tag_scheme: Literal["BIO", "IOB1", "BIOES", "BMES"] = "BIO"  # scheme of the files
    model_scheme: Literal["BIO", "BIOES"] = "BIO"  # labels of the saved model; BIO works with pipeline aggregation
    invalid_tags: Literal["repair", "error"] = "repair"
    label_all_pieces: bool = False  # label every word piece, not only the first of each word
    # Long inputs: head | tail | head_tail (head_tokens from the start + the rest from the end) | window
    truncation: Literal["head", "tail", "head_tail", "window"] = "head"
    head_tokens: int = Field(128, ge=0)
    stride: int = Field(128, ge=1)  # window step in tokens (window and QA doc stride)
    window_aggregate: Literal["mean", "vote"] = "mean"  # classification windows
    # QA: windows over the context overlap by doc_stride tokens (the usual SQuAD `doc_stride`)
    doc_stride: int = Field(128, ge=0)
    max_query_len: int = Field(64, ge=4)
    max_answer_len: int = Field(30, ge=1)
    n_best: int = Field(20, ge=1)
    # Per-task overrides of finetune.train, e.g. {epochs: 5, lr: 5e-5}.
    train_overrides: TrainOverrides = Field(default_factory=dict)
    # Per-task overrides of finetune.search (e.g. {space: {lr: [5e-4, 1e-3]}}): a key given replaces the shared one.
    search_overrides: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _format_fits(self) -> "TaskParams":
        if self.format == "lines" and not self.label_files:
            raise ValueError("format lines needs label_files: {label: file}")
        if self.format == "sqlite" and not (self.train and self.query):
            raise ValueError("format sqlite needs train (the .db file) and query")
        if self.format not in ("lines",) and not self.train:
            raise ValueError("train: a data file is required")
        if self.type == "qa" and self.format != "squad":
            raise ValueError("qa reads format squad (SQuAD/CMRC JSON)")
        if self.type == "ner" and self.format not in ("conll", "jsonl"):
            raise ValueError("ner reads format conll or jsonl")
        if self.dev_ratio + self.test_ratio >= 0.9:
            raise ValueError("dev_ratio + test_ratio must leave data to train on")
        return self

    def data_definition(self) -> dict[str, Any]:
        """The fields that decide which examples the task has and how they are read (what the splits stage reads):
        everything but how a model is fed (``FEEDING``) and the training/search overrides."""
        return self.model_dump(mode="json", exclude={*FEEDING, "train_overrides", "search_overrides"})

    def train_params(self, shared: TrainParams) -> TrainParams:
        """The shared hyperparameters with this task's overrides applied (validated like the shared section)."""
        return with_overrides(shared, self.train_overrides)

    def search_params(self, shared: SearchParams) -> SearchParams:
        """The shared search with this task's overrides applied; keys a task type has no use for are dropped
        (class weights are for classification), so no trial repeats another."""
        sp = SearchParams.model_validate({**shared.model_dump(), **self.search_overrides})
        if self.type not in ("classification", "pair_classification") and "class_weight" in sp.space:
            sp = sp.model_copy(update={"space": {k: v for k, v in sp.space.items() if k != "class_weight"}})
        return sp

    @field_validator("search_overrides")
    @classmethod
    def _search_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        SearchParams.model_validate(v)
        return v


class TaskSettings(BaseModel):
    """What one task's finetune trains with, resolved once: the task (its overrides folded in below), the training
    hyperparameters (``finetune.train`` < the task's ``train_overrides``) and the search (``finetune.search`` < the
    task's ``search_overrides``), with the one rule between a set value and a search space applied (``resolve``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    task: TaskParams
    train: TrainParams
    search: SearchParams
    # {train key: the params key that set it}, e.g. {"lr": "finetune.tasks.ner.train_overrides.lr"}; a key set
    # nowhere has its code default
    set_by: dict[str, str] = Field(default_factory=dict)
    # {space key: the setting that narrowed it}, e.g. {"lr": "finetune.train.lr"}
    narrowed: dict[str, str] = Field(default_factory=dict)

    def key(self, name: str) -> str:
        """The params key to name in a message about train key ``name``."""
        return self.set_by.get(name, f"finetune.train.{name}")


def resolve(name: str, task: TaskParams, train: TrainParams, search: SearchParams) -> TaskSettings:
    """One task's settings with the rule every door follows: a training hyperparameter that is set — in
    ``finetune.train`` (by params.yaml, a profile, ``--set``, ``dvc exp run -S`` or a Prefect knob) or in the task's
    ``train_overrides`` — is the value trained. A search space that names the same key is narrowed to that one value,
    and the narrowing is recorded (``narrowed``, the stage's spec and log): a set value never silently loses to a
    search, and a search never silently ignores a set value. A key set nowhere is searched over as the space says."""
    resolved = task.train_params(train)
    sp = task.search_params(search)
    set_by = {k: f"finetune.train.{k}" for k in train.model_fields_set}
    set_by.update({k: f"finetune.tasks.{name}.train_overrides.{k}" for k in task.train_overrides})
    narrowed: dict[str, str] = {}
    space = dict(sp.space)
    for key in sp.space if sp.trials else ():  # trials: 0 searches nothing, so nothing is shadowed
        if key in set_by:
            space[key] = [getattr(resolved, key)]
            narrowed[key] = set_by[key]
    if narrowed:
        sp = sp.model_copy(update={"space": space})
    bare = task.model_copy(update={"train_overrides": {}, "search_overrides": {}})
    return TaskSettings(task=bare, train=resolved, search=sp, set_by=set_by, narrowed=narrowed)
