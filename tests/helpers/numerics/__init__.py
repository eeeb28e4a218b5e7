"""Backends that are wrong on purpose, or right in another summation order, and the
suites they are checked on (tests/test_check_numerics.py)."""

ENTRY_POINTS = ("[opdiff_snap.backends]\n"
                "wrongkernel = helpers.numerics.backends:WrongKernelBackend\n"
                "splitsum = helpers.numerics.backends:SplitSumBackend\n")
