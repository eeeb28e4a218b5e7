"""The commands that run jobs: one pipeline, and record, check and upgrade on it."""
