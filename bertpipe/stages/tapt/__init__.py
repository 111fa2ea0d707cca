"""Task-adaptive pretraining (Gururangan et al. 2020, *Don't Stop Pretraining*): continued MLM on one finetune task's
own train texts, from the domain-adapted encoder (DAPT, then TAPT). A subpackage of ``pretrain`` so it trains with
pretrain's code, while pretrain's own code identity (``bertpipe/stages/pretrain/*.py``) does not count it."""
