"""A real MLflow sqlite registry with tiny transformers models, for the serving tests and bench/bench_serve.py."""

from __future__ import annotations

from pathlib import Path

import yaml


def tiny_model(path: Path, tokenizer_dir: Path, kind: str, seed: int, steps: int = 0, hidden: int = 32,
               layers: int = 1) -> Path:
    """A 1-layer BERT classifier ("cls") or BIO tagger ("ner") with the real tokenizer; ``steps`` of real training
    on a keyword task make the versions behave differently (a version switch is visible in predictions too)."""
    import torch
    from transformers import (AutoTokenizer, BertConfig, BertForSequenceClassification,
                              BertForTokenClassification)

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    labels = ["neg", "pos"] if kind == "cls" else ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                     intermediate_size=hidden * 2 if hidden <= 32 else hidden * 4, max_position_embeddings=64 if hidden <= 32 else 128, num_labels=len(labels),
                     id2label=dict(enumerate(labels)), label2id={lab: i for i, lab in enumerate(labels)})
    model = (BertForSequenceClassification if kind == "cls" else BertForTokenClassification)(cfg)
    if steps and kind == "cls":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        texts = ["很好很好", "非常好", "太坏了", "坏透了"] * 4
        y = torch.tensor([1, 1, 0, 0] * 4) if seed % 2 else torch.tensor([0, 0, 1, 1] * 4)
        enc = tok(texts, return_tensors="pt", padding=True)
        for _ in range(steps):
            loss = model(**enc, labels=y).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def build_registry(root: Path, tokenizer_dir: Path, versions: int = 2, kind: str = "cls",
                   name: str = "bertpipe-sentiment", hidden: int = 32, layers: int = 1) -> tuple[Path, list[str]]:
    """A project dir (params.yaml + state) whose registry holds ``versions`` versions of ``name``; v1 is champion."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client, experiment_id, fluent_mlflow
    from bertpipe.lib.registered.champion import promote
    from bertpipe.stages.register.record import log_and_register

    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump({"paths": {"work": "work", "state": ".bertpipe"}}))
    cfg = load_config(root / "params.yaml")
    task = "text-classification" if kind == "cls" else "token-classification"
    made = []
    with fluent_mlflow(cfg) as mlflow:
        for v in range(versions):
            model_dir = tiny_model(root / "models" / f"v{v + 1}", tokenizer_dir, kind, seed=v + 1, steps=30,
                                   hidden=hidden, layers=layers)
            with mlflow.start_run(experiment_id=experiment_id(cfg)):
                made.append(log_and_register(mlflow, name, model_dir, task, "zh", []))
    promote(client(cfg), name, made[0])
    return root, made
