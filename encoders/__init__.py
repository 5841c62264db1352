"""Dense text encoders for retrieval."""

from .dense import DEFAULT_ENCODER, DenseEncoder, DenseEncoderConfig, default_model_name, pool

__all__ = ["DEFAULT_ENCODER", "DenseEncoder", "DenseEncoderConfig", "default_model_name", "pool"]
