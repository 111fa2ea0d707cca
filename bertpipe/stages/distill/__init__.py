"""Task distillation: a smaller student per finetuned task (soft targets + hard labels, optional hidden matching)."""
