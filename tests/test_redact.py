"""The one URI masker: URIs alone and URIs quoted inside messages (MLflow's "API request to <url> failed")."""

from __future__ import annotations

import pytest

from bertpipe.infra.redact import mask_text, mask_uri


@pytest.mark.parametrize("text, shown", [
    ("API request to http://alice:pw1@127.0.0.1:5000/api/2.0/mlflow/runs/get failed with exception X",
     "API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/get failed with exception X"),
    ("browse: mlflow ui --backend-store-uri postgresql+psycopg2://ml:pw2@db:5432/mlflow --port 5000",
     "browse: mlflow ui --backend-store-uri postgresql+psycopg2://db:5432/mlflow --port 5000"),
    ("a https://tok3@h/x and b 'https://u:p4@h2/y?token=t5&x=1'", "a https://h/x and b 'https://h2/y?token=***&x=1'"),
    ("no uri here: user:pw@host", "no uri here: user:pw@host"),
    ("sqlite:////tmp/a@b/mlflow.db stays as written", "sqlite:////tmp/a@b/mlflow.db stays as written"),
])
def test_mask_text_drops_userinfo_and_secret_query_values(text, shown):
    assert mask_text(text) == shown


def test_mask_uri_and_mask_text_agree_on_a_bare_uri():
    uri = "https://user:secret@mlflow.example.com:5000/x?api_key=k&region=eu"
    assert mask_uri(uri) == mask_text(uri) == "https://mlflow.example.com:5000/x?api_key=***&region=eu"


def test_an_unreachable_server_is_one_masked_line():
    from mlflow.exceptions import MlflowException

    from bertpipe.infra.tracking import unreachable_line

    line = unreachable_line(MlflowException("API request to http://a:pw6@127.0.0.1:1/api/x failed with exception y"))
    assert line == "MLflow tracking server not reachable: API request to http://127.0.0.1:1/api/x failed with exception y"
    assert unreachable_line(MlflowException("Registered Model with name=x not found")) is None
    assert unreachable_line(ValueError("API request to http://x failed")) is None
