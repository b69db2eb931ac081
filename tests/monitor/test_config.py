"""Settings: precedence (flags > env > TOML > defaults), one-line errors, masked secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monitor.config import Settings, load_settings, mask_url, masked_dump
from monitor.errors import ConfigError


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "flopwatch.toml"
    path.write_text(text)
    return path


def test_env_beats_toml_and_flags_beat_env(tmp_path: Path, monkeypatch) -> None:
    """Nested env names use `__`; each source overrides only what it sets."""
    path = _toml(tmp_path, '[kafka]\ngroup_id = "from-file"\nclient_id = "file-client"\n'
                           "[alerts]\npage_loss = 0.2\n")  # fmt: skip
    monkeypatch.setenv("FLOPWATCH_KAFKA__GROUP_ID", "from-env")
    s = load_settings(path)
    assert (s.kafka.group_id, s.kafka.client_id, s.alerts.page_loss) == (
        "from-env", "file-client", 0.2)  # fmt: skip
    assert load_settings(path, http_port=0).http_port == 0
    assert Settings().alerts.page_loss == 0.10  # the default where nothing sets it


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[alerts]\npage_loss = -1\n", "alerts.page_loss"),
        ("[detector.params]\nbogus = 1\n", "unknown detector.params ['bogus']"),
        ("[detector]\nmaterial_rel = {nope = 0.1}\n", "nope"),
        ("[kafka\n", "flopwatch.toml"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_field(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, text))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_masked_dump_hides_passwords_and_url_credentials(monkeypatch) -> None:
    """Neither SecretStr values nor user:password in an Alertmanager URL reach the output."""
    monkeypatch.setenv("FLOPWATCH_KAFKA__SASL_PLAIN_PASSWORD", "hunter2")
    monkeypatch.setenv("FLOPWATCH_SINKS__ALERTMANAGER__URLS", '["https://bob:s3cret@am:9093"]')
    text = json.dumps(masked_dump(load_settings()))
    assert "hunter2" not in text
    assert "s3cret" not in text
    assert "https://***@am:9093" in text
    assert mask_url("http://am:9093/path@x") == "http://am:9093/path@x"
