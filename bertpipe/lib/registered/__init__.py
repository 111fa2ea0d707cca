"""The MLflow model registry as bertpipe uses it: champion/challenger bookkeeping (``champion``) and registered
versions as local files (``versions``, ``files``), shared by the register stage, the service, the start stage's rule
(``bertpipe.lib.lineage``) and `bertpipe models`."""
