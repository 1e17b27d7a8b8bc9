"""docs/api.md states how many public names cdsjax.core has and lists each: kept true by this test."""

import pathlib
import re

from cdsjax import core

API = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_api_doc_counts_and_lists_every_public_name():
    text = API.read_text()
    count = re.search(r"public API: (\d+) names", text)
    assert count, "docs/api.md no longer says how many public names cdsjax.core has"
    assert int(count.group(1)) == len(core.__all__), (
        f"docs/api.md says {count.group(1)} public names; cdsjax.core.__all__ has {len(core.__all__)}")
    table = text.split("| group | names |", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", table))
    assert set(core.__all__) <= listed, f"not in docs/api.md's table: {sorted(set(core.__all__) - listed)}"
    assert listed <= set(core.__all__) | {"BlockProblem.pose"}, sorted(listed - set(core.__all__))
