"""The finetune stage."""
