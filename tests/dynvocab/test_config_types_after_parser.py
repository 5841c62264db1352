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
    assert PipelineConfig(grounded=False, max_chars=None).max_chars is None
    with pytest.raises(TypeError, match="max_chars must be int or None"):
        PipelineConfig(grounded=False, max_chars="64")


@pytest.mark.parametrize("value", [0, -3])
def test_a_count_below_its_minimum_names_the_field_and_a_valid_value(value):
    with pytest.raises(ValueError, match=rf"TrainConfig.max_steps={value} must be >= 1; pass e.g. max_steps=\d+"):
        TrainConfig(max_steps=value)
    assert TrainConfig(max_steps=1).max_steps == 1


def test_a_nan_weight_is_below_every_minimum():
    from retrieval.nar.loss import NarLossWeights

    with pytest.raises(ValueError, match="NarLossWeights.docid_weight=nan must be >= 0"):
        NarLossWeights(docid_weight=float("nan"))
