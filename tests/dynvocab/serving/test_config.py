"""``ServerConfig``: its checks name the field and the fix; the API key comes from the environment when not given."""

import pytest

from dynvocab.serving import API_KEY_ENV, ServerConfig


@pytest.mark.parametrize("settings, message", [
    ({"port": 70000}, "port=70000 is not a TCP port"),
    ({"max_queue": 0}, "max_queue=0 must be >= 1"),
    ({"workers": 0}, "workers=0 must be >= 1"),
    ({"batch_wait_ms": -1.0}, "batch_wait_ms=-1.0 and shutdown_timeout=30.0 must be >= 0"),
    ({"max_tokens_limit": "512"}, "max_tokens_limit must be int"),
])
def test_a_bad_setting_is_refused_by_name(settings, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ServerConfig(**settings)


def test_the_api_key_comes_from_the_environment_unless_given(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert ServerConfig().api_key == "from-env"
    assert ServerConfig(api_key="given").api_key == "given"
    monkeypatch.setenv(API_KEY_ENV, "")
    assert ServerConfig().api_key is None
