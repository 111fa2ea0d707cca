"""The prepare stage."""
