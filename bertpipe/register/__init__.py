"""The register stage."""
