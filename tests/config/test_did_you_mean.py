"""An unknown config key close to a real one gets "did you mean" (issue 43), at the top level and in a section."""

import pytest

from attnflow.config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("data", "wrong", "meant"),
    [
        ({"seeed": 3}, "seeed", "seed"),
        ({"integration": {"dtt": 0.1}}, "integration.dtt", "dt"),
        ({"tokens": {"nn": 3}}, "tokens.nn", "n"),
        ({"weights": {"process": "ou", "sigmaa": 1.0}}, "weights.sigmaa", "sigma"),
    ],
)
def test_typo_gets_a_suggestion(data, wrong, meant):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert f"field '{wrong}'" in str(info.value)
    assert f"did you mean {meant!r}?" in str(info.value)


def test_no_suggestion_for_a_key_like_nothing():
    """Negative control: a key close to no field is named without a guess."""
    with pytest.raises(ConfigError) as info:
        parse_config({"integration": {"zzzzqq": 1}})
    assert "field 'integration.zzzzqq'" in str(info.value) and "did you mean" not in str(info.value)
