"""``without_key``: the key a service was sent, and anything shaped like a credential, masked."""

from __future__ import annotations

from openclaw_rl.runtime.secrets import without_key

# Built here, not written out: no string in the repository looks like a real key.
SHAPED = "-".join(("sk", "proj", "x1" * 12))


def test_the_known_key_and_key_shaped_text_are_masked():
    said = f"Incorrect API key provided: run-key. Also saw {SHAPED} and Bearer tok.en-1*2"
    masked = without_key(said, "run-key")
    assert "run-key" not in masked and SHAPED not in masked and "tok.en" not in masked
    assert masked.startswith("Incorrect API key provided: [key].") and "sk-[key]" in masked
    assert without_key("nothing secret here", "") == "nothing secret here"
