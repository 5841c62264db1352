"""Field type checks still hold after HfArgumentParser has resolved a config's annotations in place."""

import pytest
from transformers import HfArgumentParser

from dynvocab.training.config import TrainConfig


def test_type_check_survives_the_cli_parser():
    HfArgumentParser(TrainConfig)  # turns the fields' string annotations into classes
    with pytest.raises(TypeError, match="TrainConfig.batch_size must be int, got str '8'"):
        TrainConfig(batch_size="8")
    with pytest.raises(TypeError, match="learning_rate must be float"):
        TrainConfig(learning_rate="3e-4")


def test_optional_fields_still_take_none_after_the_parser():
    from retrieval.pipeline import PipelineConfig  # the `generate` command's config

    HfArgumentParser(PipelineConfig)  # rewrites ``max_chars: int | None`` to ``int``
    assert PipelineConfig(max_chars=None).max_chars is None
    with pytest.raises(TypeError, match="max_chars must be int or None"):
        PipelineConfig(max_chars="64")
