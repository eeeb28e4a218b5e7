"""Finding the cause of a failing verdict: localize, repro scripts, and the ATen-level search."""
