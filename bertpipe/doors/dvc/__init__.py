"""The DVC door: dvc.yaml written from the graph, dvc.lock from the stages' manifests."""
