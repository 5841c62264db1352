"""Fingerprints of weights: what a file computed by a model (cached states, stored vectors) was computed by."""

from __future__ import annotations

import hashlib
import json

import torch

__all__ = ["lm_fingerprint", "weights_digest"]


def weights_digest(module: torch.nn.Module, preamble: str = "") -> str:
    """sha256 (hex) of ``preamble``, then every weight of ``module`` by name, in name order."""
    digest = hashlib.sha256(preamble.encode())
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def lm_fingerprint(lm: torch.nn.Module) -> str:
    """A hash of the LM's config and every weight (about a second for a 135M-parameter LM): states computed by
    other weights are other states."""
    config = getattr(lm, "config", None)
    described = json.dumps(config.to_dict() if config is not None else {}, sort_keys=True, default=str)
    return weights_digest(lm, described)[:16]
