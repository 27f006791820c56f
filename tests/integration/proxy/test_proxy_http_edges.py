"""The Proxy's HTTP edges: the ``Host`` header is not reflected into the URLs it hands out, a 405 carries
``Allow``, no page loads anything from outside, and ``Accept: ...;q=0`` means "not this"."""

from __future__ import annotations

import httpx
import msgpack
import pytest

from dressage.errors import ConfigError
from dressage.proxy.config import ServerConfig
from dressage.proxy.http.upstream_routes import accepts
from dressage.trajectory.sample_wire import MSGPACK_MEDIA_TYPE


@pytest.fixture(scope="module")
def proxy(engine):
    from dressage.testing.stack import start_proxy

    with start_proxy(engine.url, r3=False) as stack:
        yield stack


@pytest.mark.parametrize("body", [None, {"metadata": {"k": 1}}])
def test_the_host_header_is_not_reflected_into_base_url(proxy, body):
    # Both the hot route (a JSON body) and the app's own (no body) build the URL the same way.
    r = httpx.post(proxy.url + "/sessions", json=body, headers={"host": "attacker.example:666"})
    assert r.status_code == 200
    sid = r.json()["session_id"]
    assert r.json()["base_url"] == f"{proxy.url}/sessions/{sid}/v1"


def test_a_configured_public_url_is_what_agents_are_sent_to(engine, proxy_stack):
    stack = proxy_stack(engine.url, r3=False, public_url="https://rollouts.example/proxy/")
    r = httpx.post(stack.url + "/sessions", headers={"host": "attacker.example"})
    sid = r.json()["session_id"]
    assert r.json()["base_url"] == f"https://rollouts.example/proxy/sessions/{sid}/v1"


def test_public_url_must_be_an_http_url():
    assert ServerConfig(public_url="http://h:1").public_url == "http://h:1/"
    for bad in ("h:1", "ftp://h", "http://h /x"):
        with pytest.raises(ConfigError, match="server.public_url"):
            ServerConfig(public_url=bad)


def test_a_405_names_the_allowed_methods(proxy):
    r = httpx.delete(proxy.url + "/trajectory/stats")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET" and r.json()["error"]["type"] == "invalid_request_error"


def test_no_docs_page_that_loads_scripts_from_a_cdn(proxy):
    assert httpx.get(proxy.url + "/docs").status_code == 404
    assert httpx.get(proxy.url + "/redoc").status_code == 404
    schema = httpx.get(proxy.url + "/openapi.json")
    assert schema.status_code == 200 and "/sessions" in schema.json()["paths"]


def test_msgpack_with_quality_zero_is_refused_as_a_format(proxy):
    for accept, binary in ((MSGPACK_MEDIA_TYPE, True), (f"{MSGPACK_MEDIA_TYPE};q=0", False),
                           (f"application/json, {MSGPACK_MEDIA_TYPE}; q=0.0", False),
                           (f"{MSGPACK_MEDIA_TYPE};q=0.5, application/json", True)):
        r = httpx.post(proxy.url + "/trajectory/read", json={}, headers={"accept": accept})
        assert r.status_code == 200
        if binary:
            assert r.headers["content-type"] == MSGPACK_MEDIA_TYPE and "data" in msgpack.unpackb(r.content)
        else:
            assert r.headers["content-type"] == "application/json" and "data" in r.json()


def test_accepts_reads_media_ranges_and_weights():
    m = "application/msgpack"
    assert accepts(m, m) and accepts(f"text/html, {m};q=0.1", m) and accepts(f"{m.upper()}", m)
    assert not accepts(f"{m};q=0", m) and not accepts(f"{m};q=bad", m) and not accepts("application/json", m)
    assert not accepts(f"{m}x", m) and not accepts("", m)
