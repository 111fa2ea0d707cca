"""Task-adaptive pretraining (Gururangan et al. 2020, *Don't Stop Pretraining*): continued MLM on one finetune task's
own train texts, from the domain-adapted encoder (DAPT, then TAPT). It trains with the MLM library pretrain trains
with (``bertpipe.lib.mlm``)."""
