"""The offline assets (the real model, tokenizers, corpora from pip packages) and the embedded corpora with their fixed
held-out splits."""

from .assets import assets_dir, licensedb_documents, read_licensedb, resolve_model
from .corpora import CORPORA, corpus_split, licence_family, split_documents, split_licensedb
from .sources import Record, iter_records

__all__ = [
    "CORPORA",
    "Record",
    "assets_dir",
    "corpus_split",
    "iter_records",
    "licence_family",
    "licensedb_documents",
    "read_licensedb",
    "resolve_model",
    "split_documents",
    "split_licensedb",
]
