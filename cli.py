"""`python cli.py ...` is the same as `opdiff ...`."""

from opdiff_snap.cli import main

if __name__ == "__main__":
    main()
