"""Typed parameters for the Prefect UI: the deployment's run form shows a number field per common knob and a
dropdown for ``profile`` and ``until``, instead of a path and a list of override strings.

Each knob set maps onto the same config override `--set KEY=VALUE` would make, applied after ``overrides`` (so a
knob wins over an override string for the same key). The dropdowns are enums in the deployment's parameter schema
(``typed_schema``): ``until`` lists the stage families, ``profile`` the params file's profiles; the flow itself keeps
``str`` for both, since the CLI also accepts a single stage (``--until finetune/sentiment/base``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# knob field -> the params key it sets
KEYS = {
    "base_max_steps": "base.max_steps",
    "pretrain_max_steps": "pretrain.max_steps",
    "pretrain_lr": "pretrain.lr",
    "finetune_epochs": "finetune.train.epochs",
    "finetune_lr": "finetune.train.lr",
    "finetune_max_train_examples": "finetune.train.max_train_examples",
}


class Knobs(BaseModel):
    """The knobs most runs change; empty ones leave params.yaml (and the profile) as they are."""

    model_config = ConfigDict(extra="forbid")

    base_max_steps: int | None = Field(None, ge=1, title="base.max_steps", examples=[200],
                                       description="Optimizer steps of the from-scratch base (model.base: scratch).")
    pretrain_max_steps: int | None = Field(None, ge=1, title="pretrain.max_steps", examples=[200],
                                           description="Optimizer steps of domain pretraining.")
    pretrain_lr: float | None = Field(None, gt=0, title="pretrain.lr", examples=[5e-4],
                                      description="Peak learning rate of domain pretraining.")
    finetune_epochs: int | None = Field(
        None, ge=1, title="finetune.train.epochs", examples=[3],
        description="Epochs of every task's finetune (a task's own train_overrides.epochs wins).")
    finetune_lr: float | None = Field(
        None, gt=0, title="finetune.train.lr", examples=[3e-4],
        description="Learning rate of every task's finetune (a task's own train_overrides.lr wins); a search space "
                    "naming lr is narrowed to it.")
    finetune_max_train_examples: int | None = Field(
        None, ge=0, title="finetune.train.max_train_examples", examples=[6000],
        description="Cap on each task's training examples (0: all; a task's own train_overrides cap wins).")

    def overrides(self) -> list[str]:
        return [f"{KEYS[k]}={v!r}" for k, v in self.model_dump().items() if v is not None]


def typed_schema(schema, families: list[str], profiles: list[str]) -> None:
    """Give the deployment's ``until`` and ``profile`` parameters their choices (a ParameterSchema, in place)."""
    props = schema.properties
    props["until"] = {"title": "until", "description": "Stop after this stage family (empty: the whole chain).",
                      "anyOf": [{"type": "string", "enum": families}, {"type": "null"}], "default": None}
    if profiles:
        props["profile"] = {"title": "profile", "description": "The profile to apply (empty: params.yaml's).",
                            "anyOf": [{"type": "string", "enum": profiles}, {"type": "null"}], "default": None}
