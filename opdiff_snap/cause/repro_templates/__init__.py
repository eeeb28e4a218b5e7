"""The fixed text of a standalone repro script (cause/repro.py), as Python files that
linters and the type checker read.

Each file's text below its `script text` banner is written into every script as it
stands; what is above the banner lets the file be read alone: the imports the script's
own header provides, and the names the writer generates (declared in `generated.pyi`).
A script needs none of this package: nothing here is imported, by the package or by a
script.
"""
