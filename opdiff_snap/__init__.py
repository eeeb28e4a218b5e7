"""opdiff-snap: golden-file regression store for PyTorch ops and modules across backends."""

__version__ = "0.1.0"
