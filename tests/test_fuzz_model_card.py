"""Hypothesis-driven fuzzing of the model card reader: whatever README.md's front matter holds,
general_metadata() gives metadata (warnings allowed) and never raises; every card value it writes
is a string, as the GGUF keys require."""

from __future__ import annotations

from datetime import timedelta

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufsmith.converters.general_metadata import ParameterCount, general_metadata

CARD_KEYS = ["name", "model_name", "author", "version", "license", "license_name", "tags", "pipeline_tag",
             "language", "languages", "base_model", "base_models", "datasets", "dataset", "description", "url"]
FUZZ_SETTINGS = settings(max_examples=150, deadline=timedelta(seconds=5), derandomize=True,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=8),
                    st.dates())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                      max_leaves=8)
cards = st.dictionaries(st.sampled_from(CARD_KEYS), values, max_size=6)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("card")


def metadata_of(model_dir, front_matter: str) -> dict:
    (model_dir / "README.md").write_text(f"---\n{front_matter}\n---\n# card\n", encoding="utf-8")
    md = general_metadata(model_dir, {}, ParameterCount(total=1000))
    return {key: value.plain() for key, value in md.items()}


@FUZZ_SETTINGS
@given(card=cards)
def test_any_yaml_card_gives_string_metadata(model_dir, card):
    metadata = metadata_of(model_dir, yaml.safe_dump(card))
    for key, value in metadata.items():
        if key.startswith("general.") and key not in ("general.base_model.count", "general.dataset.count"):
            items = value if isinstance(value, list) else [value]
            assert all(isinstance(v, str) for v in items), (key, value)


@FUZZ_SETTINGS
@given(text=st.text(alphabet=st.sampled_from(list("ab:-[]{}&*!|>'\"#, \n\t?%@`0")), max_size=80))
def test_any_front_matter_text_is_read_or_skipped(model_dir, text):
    metadata_of(model_dir, text)
