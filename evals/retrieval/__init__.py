"""Scores of retrievers: ranking metrics with paired intervals, the retrieval protocol, and index footprints."""
