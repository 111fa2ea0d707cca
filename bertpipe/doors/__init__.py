"""The doors: how a user runs bertpipe (the CLI, DVC, the model service; the Prefect door lives in flows/ and tasks/).

Layers, top down: doors, graph, stages, lib, core, infra; a module imports only its own layer and the ones below."""
