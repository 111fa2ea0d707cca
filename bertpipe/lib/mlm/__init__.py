"""Masked-LM pretraining, shared by the pretrain and tapt stages: the data (segments, packing, batches), masking,
the model and its losses, the training run, its report and the params model of both sections."""
