"""Dense text encoders for retrieval."""

from .dense import DEFAULT_ENCODER, DenseEncoder, DenseEncoderConfig, pool

__all__ = ["DEFAULT_ENCODER", "DenseEncoder", "DenseEncoderConfig", "pool"]
