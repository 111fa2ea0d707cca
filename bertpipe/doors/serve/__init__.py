"""The model service, `bertpipe models serve`: LitServe behind a request guard, following a registered alias."""
