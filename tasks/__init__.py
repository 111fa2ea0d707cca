"""Prefect tasks, one per bertpipe stage (all built from the same library stage objects)."""
