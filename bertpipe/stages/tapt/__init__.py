"""Task-adaptive pretraining (Gururangan et al. 2020, *Don't Stop Pretraining*): continued MLM on one finetune task's
own train texts, from the domain-adapted encoder (DAPT, then TAPT). A stage package of its own that trains with the
pretrain package's MLM code (the one import between stage packages: ``bertpipe.graph.contracts.CROSS_STAGE_IMPORTS``),
so pretrain's code identity (``bertpipe/stages/pretrain/*.py``) does not count TAPT's modules."""
