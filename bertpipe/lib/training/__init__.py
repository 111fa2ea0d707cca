"""The library every stage that trains or scores a task head stands on: the one training loop (``trainloop``, which
pretraining runs too) and its task-model side (``loop``), the heads, features and batches, long-text windows, tagging
and QA helpers, class-imbalance weights, degenerate-run detection, task files and the hyperparameter models. Stages
import it."""
