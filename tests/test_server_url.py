"""Server URLs: which typos are refused, and which spellings address one server."""

from __future__ import annotations

import pytest

from runner.errors import UsageError
from runner.transport.server_url import check_server_url, same_server


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://localhost:8188", "http://127.0.0.1:8188"),
        ("http://127.0.0.1:8188", "http://127.0.0.1:8188/"),
        ("http://LocalHost:8188", "http://[::1]:8188"),
        ("http://[::ffff:127.0.0.1]:8188", "http://localhost:8188"),
        ("http://gpu1.example:80", "http://GPU1.example"),
        ("https://gpu1.example", "https://gpu1.example:443/"),
        ("http://[2001:db8::1]:8188", "http://[2001:0db8:0:0::1]:8188"),
        ("http://proxy/comfy1", "http://proxy/comfy1/"),
    ],
)
def test_spellings_of_one_server_are_one_server(first: str, second: str) -> None:
    assert same_server(first, second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("http://127.0.0.1:8188", "http://127.0.0.1:8189"),
        ("http://127.0.0.1:8188", "https://127.0.0.1:8188"),
        ("http://gpu1:8188", "http://gpu2:8188"),
        ("http://localhost:8188", "http://192.168.1.5:8188"),  # may be one; the URLs do not say so
        ("http://localhost:8188", "http://127.0.0.2:8188"),  # a server on 127.0.0.1 is not there
        ("http://proxy/comfy1", "http://proxy/comfy2"),
        ("http://gpu1:80", "http://gpu1:8080"),
    ],
)
def test_different_servers_are_different(first: str, second: str) -> None:
    assert not same_server(first, second)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("127.0.0.1:8188", "must be an http:// or https:// URL"),
        ("http://:8188", "names no host"),
        ("http://h:0", "port 0 is no port"),
        ("http://h:99999", "out of range"),
        ("http://h:8188/?x=1", "has a query or fragment"),
    ],
)
def test_a_typo_is_a_usage_error_naming_the_url(url: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        same_server(url, "http://127.0.0.1:8188")
    with pytest.raises(UsageError, match=said):
        check_server_url(url)
