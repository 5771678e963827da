"""The client warns before it sends a token in clear text to another machine."""

from __future__ import annotations

import warnings

import pytest

from reprotrain import Client, InsecureTransportWarning


@pytest.mark.parametrize(
    "url", ["http://api.example.org:8000", "http://10.1.2.3:8000", "http://[2001:db8::1]/"]
)
def test_plain_http_to_another_host_with_a_token_warns(url: str) -> None:
    with pytest.warns(InsecureTransportWarning, match="clear text"):
        Client(url, "rpt_1_" + "x" * 43).close()


@pytest.mark.parametrize(
    ("url", "token"),
    [
        ("https://api.example.org", "rpt_1_" + "x" * 43),
        ("http://127.0.0.1:8000", "rpt_1_" + "x" * 43),
        ("http://localhost:8000", "rpt_1_" + "x" * 43),
        ("http://[::1]:8000", "rpt_1_" + "x" * 43),
        ("http://api.example.org:8000", None),  # nothing secret to send
    ],
)
def test_https_loopback_or_no_token_is_quiet(
    url: str, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPRO_TOKEN", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Client(url, token).close()
