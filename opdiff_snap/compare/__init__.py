"""Comparing outputs with goldens, and the result of one job."""
