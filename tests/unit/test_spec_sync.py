"""tests/spec/openai_schemas.json is an extract of the shared OpenAI spec; it must not
drift from it (regenerate with tests/spec/extract.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.openai_spec import SHARED_SPEC, SPEC_DIR


@pytest.mark.skipif(not SHARED_SPEC.exists(), reason="shared/openai/openapi.yaml not beside "
                    "the checkout")
def test_extract_matches_the_shared_spec() -> None:
    from tests.spec.extract import extract

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with SHARED_SPEC.open(encoding="utf-8") as f:
        spec = yaml.load(f, Loader=loader)
    committed = json.loads((SPEC_DIR / "openai_schemas.json").read_text())
    assert json.loads(json.dumps(extract(spec), sort_keys=True)) == committed
