"""Where domain pretraining starts, as a file: ``work/start/start.json``, written by the ``start`` stage.

Its location and reader are in ``bertpipe.lib.layout`` (``start_file``, ``read_start``): the graph reads it like any
other input (the vocab stage's ``start``, ``model`` and ``tokenizer`` inputs), so walking the graph (`bertpipe stages`, dvc.yaml, every Prefect cache key) asks nothing of the MLflow registry; only the start
stage's run does (``bertpipe.stages.start.stage``), once per run. The file::

    {"kind": "base" | "champion" | "path",
     "model": the encoder to extend (null for "base": the graph's base model, which may be a stage's output),
     "name", "version": the registered encoder version (champion), "model_digest": its exported files' digest,
     "corpus": the prepare fingerprint the decision was made for,
     "start": the record vocab stamps into the model's config (bertpipe_lineage.start)}

It holds no time stamps: the same decision is the same bytes, so rewriting it leaves vocab fresh.
"""
