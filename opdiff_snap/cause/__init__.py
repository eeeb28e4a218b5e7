"""Finding the cause of a failing verdict: localize, repro scripts, gradient parity (issue 8)."""
