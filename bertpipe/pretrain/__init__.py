"""The pretrain stage."""
