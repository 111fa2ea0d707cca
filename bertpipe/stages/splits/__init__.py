"""The splits stage: every finetune task's train/dev/test splits, materialised once into work/splits/ (read them with
``bertpipe.lib.labelled``)."""
