"""Run files: written, resumed, synced to a store behind a URL, split into shards."""
