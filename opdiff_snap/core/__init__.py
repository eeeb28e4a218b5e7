"""The foundations every layer may import."""
