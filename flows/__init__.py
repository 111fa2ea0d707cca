"""Prefect flows chaining the bertpipe stage tasks."""
