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
