"""`python -m opdiff_snap.cli ...` is the same as `opdiff ...`."""

from . import main

main()
