"""Suites written from other sources of tests (torch's OpInfo database)."""
