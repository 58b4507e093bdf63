"""What a reverse proxy in front of ComfyUI answers, and what the runner makes of it: a compressed
output file, a gateway error while ComfyUI behind it restarts, a refusal for want of a token, a
redirect, a websocket it does not pass on, a certificate of a private CA, a forward proxy that does not
answer. Fault injection a real server cannot give: the scripted fake server plays the proxy."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import logging
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.batch.pool import probe_server
from runner.errors import PromptTimeoutError, ServerError, ServerUnreachableError, UsageError
from runner.tracking.outputs import download_outputs
from runner.tracking.prompt import run_prompt
from runner.transport.client import ComfyClient
from runner.transport.retry import RetryPolicy
from runner.transport.server_url import check_server_url
from tests.fake_server import OUTPUTS, VIDEO_BYTES, WORKFLOW, FakeComfy
from tests.test_client_faults import finish_normally, start_and_enter_node_2


async def runs_to_the_end(fake: FakeComfy, pid: str) -> None:
    await start_and_enter_node_2(fake, pid)
    await finish_normally(fake, pid)


async def runs_on(fake: FakeComfy, pid: str) -> None:
    await start_and_enter_node_2(fake, pid)


@pytest.mark.parametrize("compress", ["asked", "always"])
def test_a_compressing_proxy_leaves_the_output_files_as_they_are(compress: str, tmp_path: Path) -> None:
    """A proxy gzipping what accepts it (Traefik's compress middleware): the gzip was saved as the
    video, with its size and sha256, exit 0. The file is asked for as it is, and a proxy that
    compresses anyway is decoded."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.compress_view = compress
        result = run_prompt(client, WORKFLOW, timeout=20)
        (file,) = download_outputs(client, result.outputs, tmp_path / "run")
    assert file.path.read_bytes() == VIDEO_BYTES
    assert file.bytes == len(VIDEO_BYTES) and file.sha256 == hashlib.sha256(VIDEO_BYTES).hexdigest()


def test_an_output_compressed_past_decoding_is_refused_not_saved(tmp_path: Path) -> None:
    """A proxy forcing brotli (httpx decodes it only with the brotli package): its bytes would have been
    saved as the video."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.compress_view = "br"
        result = run_prompt(client, WORKFLOW, timeout=20)
        with pytest.raises(
            ServerError, match=r"came compressed with br although asked for the file as it is"
        ):
            download_outputs(client, result.outputs, tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []


def test_a_gateway_answer_is_repeated_as_a_cut_connection_is(tmp_path: Path) -> None:
    """ComfyUI restarting behind a proxy is a 502/503/504 page, not a cut: one on /history after the
    prompt ran failed the run (no record, no outputs), one on /view failed the download."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.proxy_answers = [("/object_info", 504), ("/history", 502), ("/view", 503)]
        assert client.get_json("/object_info") == {}
        result = run_prompt(client, WORKFLOW, timeout=20)
        (file,) = download_outputs(client, result.outputs, tmp_path / "run")
    assert result.status == "success" and result.outputs == OUTPUTS
    assert file.path.read_bytes() == VIDEO_BYTES
    assert [call for call in fake.calls if call[0].startswith("proxy")] == [
        ("proxy 504", "/object_info"),
        ("proxy 502", f"/history/{result.prompt_id}"),
        ("proxy 503", "/view"),
    ]
    assert client.retries_made == 3


def test_a_gateway_answer_to_a_submission_does_not_queue_the_prompt_twice() -> None:
    """A 502 for POST /prompt may come after ComfyUI took it: it is sent again only once /queue and
    /history say ComfyUI does not have it, as after a cut."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.proxy_answers = [("/prompt", 502)]
        result = run_prompt(client, WORKFLOW, timeout=20)
    assert result.status == "success"
    assert [call for call in fake.calls if call[0] == "POST /prompt"] == [("POST /prompt", result.prompt_id)]
    assert ("proxy 502", "/prompt") in fake.calls


def test_answers_of_a_proxy_say_what_they_mean() -> None:
    """Each said as a web page "not ComfyUI's API (is this URL a ComfyUI server?)", pointing away from
    the token, the redirect or the ComfyUI behind the proxy."""
    with FakeComfy(runs_to_the_end) as fake:
        fake.proxy_answers = [("/object_info", 502)] * 3 + [("/object_info", 401)] * 2
        fake.proxy_answers += [("/object_info", 403), ("/object_info", 301)]
        with ComfyClient(fake.url, retry=RetryPolicy(retries=2)) as client:
            with pytest.raises(ServerError) as down:
                client.get_json("/object_info")
            with pytest.raises(ServerError) as bare:
                client.get_json("/object_info")
        with ComfyClient(fake.url, token="t0ken") as client, pytest.raises(ServerError) as wrong:
            client.get_json("/object_info")
        with ComfyClient(fake.url, headers={"X-Api-Key": "k3y"}) as client:
            with pytest.raises(ServerError) as forbidden:
                client.get_json("/object_info")
            with pytest.raises(ServerError) as moved:
                client.get_json("/object_info")
    assert str(down.value) == (
        f"GET {fake.url}/object_info after 3 attempts answered 502 Bad Gateway from a proxy in front of "
        "ComfyUI: ComfyUI behind it does not answer (down, starting or restarting?)"
    )
    assert "answered 401 Unauthorized: refused without credentials (a proxy in front of ComfyUI?): give " in (
        str(bare.value)
    )
    assert "--token, or --header 'NAME: VALUE' (or $LEANVIDEO_TOKEN)" in str(bare.value)
    assert (down.value.status, bare.value.status, forbidden.value.status, moved.value.status) == (
        502,
        401,
        403,
        301,
    )
    assert "answered 401 Unauthorized: the token or headers given were refused" in str(wrong.value)
    assert "answered 403 Forbidden: the token or headers given were refused" in str(forbidden.value)
    assert "t0ken" not in str(wrong.value) and "k3y" not in str(forbidden.value)
    assert (
        "answered 301 Moved Permanently: it redirects to https://comfy.example/comfy: give that as the "
        "server URL" in str(moved.value)
    )


def test_a_websocket_the_proxy_refuses_is_replaced_by_polling(caplog: pytest.LogCaptureFixture) -> None:
    """Every run failed after six handshakes with the library's dump of the refusal; the prompt is
    followed through /history and /queue instead, said once, and stopped as ever at its timeout."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.ws_refusal = 404
        with caplog.at_level(logging.WARNING):
            result = run_prompt(client, WORKFLOW, timeout=20)
        assert result.status == "success" and result.outputs == OUTPUTS
        assert result.server_seconds is not None
        assert fake.calls.count(("proxy 404", "/ws")) == 1  # a refusal is not asked again
        said = [r.getMessage() for r in caplog.records if "/ws refused the websocket" in r.getMessage()]
        assert said == [
            f"{fake.url}/ws refused the websocket (404 Not Found): the server, or a proxy in front of it "
            "that does not pass websockets on; the prompt is followed by asking /history and /queue every "
            "0.5 s instead (no progress of its steps, no node's own time): let the proxy pass websockets "
            "on for /ws"
        ]
    with FakeComfy(runs_on) as fake, ComfyClient(fake.url) as client:
        fake.ws_refusal = 400
        with pytest.raises(PromptTimeoutError):
            run_prompt(client, WORKFLOW, timeout=1.5)
        assert any(call[0] == "POST /interrupt" for call in fake.calls)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[str, Path, list[int]]]:
    """An HTTPS server answering ``{}`` to every GET, with a certificate of its own (no CA trusts it):
    its URL, the certificate and how many connections it accepted."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no certificate to serve")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    accepted = [0]

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def get_request(self) -> tuple[socket.socket, object]:
            accepted[0] += 1
            return super().get_request()

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = Server(("127.0.0.1", 0), Answer)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert, accepted
    finally:
        server.shutdown()
        server.server_close()


def test_a_certificate_no_ca_here_trusts_is_said_once_with_what_to_give(
    tls_server: tuple[str, Path, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenSSL's words, retried five times; now one refusal naming the host and SSL_CERT_FILE, which
    then works, for the websocket too (same context)."""
    url, cert, accepted = tls_server
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    host = url.removeprefix("https://")
    with ComfyClient(url) as client:
        with pytest.raises(ServerError) as untrusted:
            client.get_json("/object_info")
        with pytest.raises(ServerError) as websocket_too:
            client.connect_websocket()
    assert str(untrusted.value).startswith(
        f"cannot reach ComfyUI at {url}/object_info: the certificate of {host} is not trusted ("
    )
    assert "is not trusted (self-signed certificate): " in str(untrusted.value)
    assert str(untrusted.value).endswith("give the CA that signed it as a PEM file with "
        "SSL_CERT_FILE=/path/to/ca.pem (or a hashed folder with SSL_CERT_DIR)")  # fmt: skip
    assert f"cannot open the websocket of {url}: the certificate of {host} is not trusted" in str(
        websocket_too.value
    )
    assert accepted[0] == 2  # one for each: neither was repeated
    # a batch worker says why the server is out, not "no answer to GET /system_stats"
    assert probe_server(url) == f"the certificate of {host} is not trusted (self-signed certificate): " + (
        "give the CA that signed it as a PEM file with SSL_CERT_FILE=/path/to/ca.pem (or a hashed folder "
        "with SSL_CERT_DIR)"
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    with ComfyClient(url) as client:
        assert client.get_json("/object_info") == {}


def test_a_forward_proxy_of_the_environment_is_named_when_it_does_not_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With $http_proxy naming a proxy that is down, 'connection refused' was blamed on ComfyUI."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for name in ("no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://user:pw@127.0.0.1:{port}")
    with FakeComfy(runs_to_the_end) as fake:
        no_retry = ComfyClient(fake.url, retry=RetryPolicy(retries=0))
        with no_retry as client, pytest.raises(ServerError) as refused:
            client.get_json("/object_info")
        assert f"(through the proxy http://127.0.0.1:{port} that the environment names" in str(refused.value)
        assert "pw" not in str(refused.value)
        monkeypatch.setenv("no_proxy", "127.0.0.1")
        with ComfyClient(fake.url) as client:
            assert client.get_json("/object_info") == {}


def test_credentials_are_given_once_and_never_in_the_url() -> None:
    """A password in the URL reached HTTP requests but not the websocket, and was printed with every
    line naming the server; a token beside an Authorization header sent both."""
    with pytest.raises(UsageError) as in_url:
        check_server_url("https://alice:pa55word@127.0.0.1:8743/comfy")
    assert "'https://***@127.0.0.1:8743/comfy' holds a user name and password" in str(in_url.value)
    assert "pa55word" not in str(in_url.value)
    for faulty in ("https://u:pa55word@h:88x43/c", "htps://u:pa55word@h/c", "https://u:pa55word@[::1/c"):
        with pytest.raises(UsageError) as refused:  # other faults too: the password was said with them
            check_server_url(faulty)
        assert "pa55word" not in str(refused.value) and "***@" in str(refused.value)
    with pytest.raises(UsageError) as token_as_user:
        check_server_url("https://s3cr3tT0ken@host/comfy")
    assert "s3cr3tT0ken" not in str(token_as_user.value)
    with pytest.raises(UsageError, match="both a token and an Authorization header"):
        ComfyClient("http://127.0.0.1:8188", token="t", headers={"authorization": "Basic eA=="})
    with contextlib.closing(ComfyClient("http://127.0.0.1:8188", token="t")) as client:
        assert client.headers == {"Authorization": "Bearer t"}


def test_history_a_proxy_will_not_give_after_the_prompt_ends_keeps_a_partial_record() -> None:
    """/history failing after the prompt ran ended the run with no record at all (a plain ServerError);
    it is the lost server it is, with what was seen of the prompt."""
    with FakeComfy(runs_to_the_end) as fake:
        fake.proxy_answers = [("/history", 502)] * 200
        with (
            ComfyClient(fake.url, retry=RetryPolicy(retries=0), reconnect_timeout=1.0) as client,
            pytest.raises(ServerUnreachableError) as lost,
        ):
            run_prompt(client, WORKFLOW, timeout=20)
    assert "has failed for 1 s after prompt" in str(lost.value)
    assert "answered 502 Bad Gateway from a proxy in front of ComfyUI" in str(lost.value)
    assert lost.value.result is not None and lost.value.result.partial
    assert [node.node_id for node in lost.value.result.nodes][:1] == ["1"]


def test_a_gateway_that_answers_json_is_still_a_gateway() -> None:
    """Kong, API Gateway and the like answer 502 with JSON: it was taken as ComfyUI's own answer."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.proxy_json = True
        fake.proxy_answers = [("/object_info", 502), ("/prompt", 504)]
        assert client.get_json("/object_info") == {}
        result = run_prompt(client, WORKFLOW, timeout=20)
    assert result.status == "success"
    assert [call for call in fake.calls if call[0] == "POST /prompt"] == [("POST /prompt", result.prompt_id)]


def test_polling_says_a_running_prompt_started_and_what_a_stop_did(tmp_path: Path) -> None:
    """Followed by polling, a prompt running on the server was 'still waiting in the server's queue'
    when its timeout stopped it, and its run had no start (a bench divided by a zero time)."""
    with FakeComfy(runs_on) as fake, ComfyClient(fake.url) as client:
        fake.ws_refusal = 404
        events: list[str] = []
        with pytest.raises(PromptTimeoutError) as late:
            run_prompt(client, WORKFLOW, timeout=2.0, on_event=lambda e: events.append(e.kind))
    assert "started" in events
    said = str(late.value)
    assert "removed from the server's queue and interrupted there" in said, said
    assert late.value.result is not None and late.value.result.started_at is not None
    assert late.value.result.error is not None
    assert late.value.result.error["message"] == (
        "timeout after it started (which node ran is not known without the websocket)"
    )


def test_a_websocket_a_proxy_answers_502_for_is_followed_by_polling(caplog: pytest.LogCaptureFixture) -> None:
    """It failed the run with the library's dump of the answer, its headers (a cookie) included."""
    with FakeComfy(runs_to_the_end) as fake, ComfyClient(fake.url) as client:
        fake.ws_refusal = 502
        with caplog.at_level(logging.WARNING):
            result = run_prompt(client, WORKFLOW, timeout=20)
    assert result.status == "success"
    said = [r.getMessage() for r in caplog.records if "/ws answered the websocket 502" in r.getMessage()]
    assert len(said) == 1 and "6 times: a proxy in front of ComfyUI" in said[0] and "-+-+-" not in said[0]


def test_a_refusal_while_following_is_said_at_once_not_waited_out() -> None:
    """A proxy that turned to 401 mid-job was waited out as a server gone away (30 s, then 'has failed
    for 30 s')."""
    import time

    with FakeComfy(runs_on) as fake, ComfyClient(fake.url, reconnect_timeout=30.0) as client:
        fake.ws_refusal = 404
        fake.proxy_answers = [("/history", 401)] * 100
        began = time.monotonic()
        with pytest.raises(ServerError) as refused:
            run_prompt(client, WORKFLOW, timeout=60)
    assert time.monotonic() - began < 10
    assert not isinstance(refused.value, ServerUnreachableError) and refused.value.status == 401
    assert "answered 401 Unauthorized: refused without credentials" in str(refused.value)


def test_a_ca_in_ssl_cert_dir_is_trusted_where_ssl_cert_file_is_set_too(
    tls_server: tuple[str, Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx read SSL_CERT_FILE alone when it is set (containers and Nix images set it): the CA in
    SSL_CERT_DIR, which the error message named, was trusted by the websocket only."""
    import certifi

    url, cert, _ = tls_server
    hashed = tmp_path / "cadir"
    hashed.mkdir()
    name = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(cert)], check=True, capture_output=True, text=True
    ).stdout.strip()
    shutil.copy(cert, hashed / f"{name}.0")
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())  # a bundle without the private CA
    monkeypatch.setenv("SSL_CERT_DIR", str(hashed))
    with ComfyClient(url) as client:
        assert client.get_json("/object_info") == {}
        with pytest.raises(ServerError) as handshake:  # the TLS is trusted; this server speaks no /ws
            client.connect_websocket(retry=False)
    assert "not trusted" not in str(handshake.value)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(UsageError, match=r"SSL_CERT_FILE=.*missing\.pem: no such PEM file"):
        ComfyClient(url)
    with contextlib.closing(ComfyClient("http://127.0.0.1:8188")):  # plain HTTP reads no certificate
        pass


@pytest.mark.parametrize(
    ("server", "location", "said"),
    [
        ("http://h:8846", "https://h:8843/object_info", "https://h:8843"),
        ("http://h:8846/comfy", "https://h:8843/comfy/object_info", "https://h:8843/comfy"),
        ("http://h/comfy", "https://h/object_info", "https://h"),
        ("http://h", "https://login.example/sso?next=1", "https://login.example/sso?next=1"),
    ],
)
def test_a_redirect_names_the_server_url_to_give(server: str, location: str, said: str) -> None:
    """Without a path it named the URL of the request itself (https://…/object_info) as the server."""
    import httpx

    from runner.transport.answers import describe_answer

    request = httpx.Request("GET", f"{server}/object_info")
    response = httpx.Response(301, headers={"Location": location}, request=request)
    assert f"it redirects to {said}: give that as the server URL" in describe_answer(
        response, credentials=False, server=server
    )


def test_a_batch_worker_says_what_a_server_answered_it_cannot_use() -> None:
    """A redirect or a proxy's gateway page was 'no answer to GET /system_stats'."""
    with FakeComfy(runs_to_the_end) as fake:
        fake.proxy_answers = [("/system_stats", 301), *[("/system_stats", 502)] * 6]
        moved = probe_server(fake.url)
        down = probe_server(fake.url)
    assert isinstance(moved, str) and "answered 301 Moved Permanently: it redirects to https://comfy" in moved
    assert isinstance(down, str) and "answered 502 Bad Gateway from a proxy in front of ComfyUI" in down


def test_https_to_a_plain_http_server_is_said_once_with_the_url_to_give() -> None:
    """OpenSSL's 'wrong version number', retried six times."""
    with FakeComfy(runs_to_the_end) as fake:
        https = fake.url.replace("http://", "https://")
        with ComfyClient(https) as client, pytest.raises(ServerError) as plain:
            client.get_json("/object_info")
    assert str(plain.value) == (
        f"cannot reach ComfyUI at {https}/object_info: it answers plain HTTP, not HTTPS: give {fake.url}"
    )
