"""Files the library writes and checks: atomic folder writes with a hashed manifest, JSON lines, hashed safetensors
folders, fingerprints of the weights a file was computed by."""

from .atomic import atomic_directory, file_sha256, read_manifest, recover, remove_directory, verify
from .fingerprints import lm_fingerprint, weights_digest
from .jsonl import iter_jsonl
from .tensor_files import read_tensor_folder, write_tensor_folder

__all__ = [
    "atomic_directory",
    "file_sha256",
    "iter_jsonl",
    "lm_fingerprint",
    "read_manifest",
    "read_tensor_folder",
    "recover",
    "remove_directory",
    "verify",
    "weights_digest",
    "write_tensor_folder",
]
