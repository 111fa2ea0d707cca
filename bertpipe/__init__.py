"""bertpipe: domain-adapt, finetune, evaluate and register BERT-family models."""

__version__ = "0.1.0"
