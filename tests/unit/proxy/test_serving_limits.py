"""``dressage.serving``: the connection limits hold with either HTTP parser (httptools and h11)."""

from __future__ import annotations

import socket
import time

import pytest

from dressage.errors import ConfigError
from dressage.serving import ConnectionLimits, Refused, UvicornServer, guarded_protocol

async def _echo(scope, receive, send):
    """Answers every request with the length of the body it read."""
    if scope["type"] != "http":
        return
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _server(http: str, refuse_head=None, **limits) -> UvicornServer:
    if http == "httptools":
        pytest.importorskip("httptools")
    words = {} if refuse_head is None else {"refuse_head": refuse_head}
    srv = UvicornServer(_echo, name="echo", http=http, limits=ConnectionLimits(**limits), **words)
    srv.start_background()
    return srv


def _connect(srv: UvicornServer) -> socket.socket:
    host, port = srv.url[7:].rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def _refused(srv: UvicornServer, head: bytes) -> tuple[bool, bytes]:
    """Send ``head`` on a new connection (the server may close it before the last byte is sent); (closed
    by the server, what it answered)."""
    sock = _connect(srv)
    try:
        sock.sendall(head)
    except (BrokenPipeError, ConnectionResetError):
        pass  # closed while sending: the refusal came first
    try:
        return _read_until_closed(sock, 10)
    finally:
        sock.close()


def _read_until_closed(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """(closed by the server within ``seconds``, the bytes it sent)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True, got
            got += data
    except socket.timeout:
        return False, got
    except ConnectionResetError:
        return True, got


def _split_answer(got: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = got.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    return status, dict(line.split(b": ", 1) for line in lines), body


def _request(sock: socket.socket, body: bytes = b"abc", headers: bytes = b"") -> bytes:
    sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (headers, len(body), body))
    sock.settimeout(10)
    got = b""
    while not (b"\r\n\r\n" in got and got.endswith(str(len(body)).encode())):
        data = sock.recv(4096)
        if not data:
            break
        got += data
    return got


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_protocol_class_follows_the_parser(http):
    if http == "httptools":
        pytest.importorskip("httptools")
    cls = guarded_protocol(ConnectionLimits(), http)
    assert cls.__name__ == {"h11": "GuardedH11Protocol", "httptools": "GuardedHttpToolsProtocol"}[http]


def test_unknown_parser_is_a_config_error():
    with pytest.raises(ConfigError, match="http: 'h2'"):
        guarded_protocol(ConnectionLimits(), "h2")


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_silent_and_half_sent_headers_are_cut_off(http):
    srv = _server(http, header_timeout_s=0.3, body_timeout_s=5.0)
    try:
        silent, partial = _connect(srv), _connect(srv)
        partial.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\n")
        assert _read_until_closed(silent, 10)[0]
        assert _read_until_closed(partial, 10)[0]
        # a client that keeps its connection and sends nothing after an answer is not on the header
        # clock (the keep-alive timeout applies), and its next request is served
        kept = _connect(srv)
        assert b" 200 " in _request(kept)
        assert not _read_until_closed(kept, 1.0)[0]
        assert b" 200 " in _request(kept, b"hello")
        kept.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_body_that_never_ends_is_cut_off(http):
    srv = _server(http, header_timeout_s=5.0, body_timeout_s=0.3)
    try:
        slow = _connect(srv)
        slow.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        assert _read_until_closed(slow, 10)[0]
        ok = _connect(srv)
        assert b" 200 " in _request(ok, b"x" * 5000)  # a whole body in time is served
        ok.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_whole_request_with_too_many_header_bytes_in_one_read_is_400(http):
    """The request line, an oversized header block and the blank line in one write: the server reads it
    in one go, so the count must be taken before the parser consumes (and answers) the whole request
    (h11's own bound covers a header block still incomplete only)."""
    srv = _server(http, max_header_bytes=8 * 1024)
    try:
        for _ in range(5):
            closed, got = _refused(srv, b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * (32 * 1024) + b"\r\n\r\n")
            status, headers, body = _split_answer(got)  # plain text: the server words it no other way
            assert status == b"HTTP/1.1 400 Bad Request" and body == b"Request headers too large.", got[:80]
            assert headers[b"content-type"] == b"text/plain; charset=utf-8"
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_large_body_after_a_blank_line_split_across_reads_is_not_counted_as_headers(http):
    srv = _server(http, max_header_bytes=8 * 1024)
    try:
        body = b"b" * (32 * 1024)
        ok = _connect(srv)
        ok.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body))
        time.sleep(0.2)  # the server reads the head up to its last line break on its own
        ok.sendall(b"\r\n" + body)
        ok.settimeout(10)
        got = b""
        while not got.endswith(str(len(body)).encode()):
            data = ok.recv(4096)
            if not data:
                break
            got += data
        assert b" 200 " in got, got[:80]
        ok.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_header_block_over_the_limit_is_400_and_closed(http):
    srv = _server(http, max_header_bytes=8 * 1024)
    try:
        closed, got = _refused(srv, b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * (32 * 1024))
        assert closed and got.startswith(b"HTTP/1.1 400 "), got[:80]
        # headers under the limit, in many small writes, are fine
        ok = _connect(srv)
        head = b"POST /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * (4 * 1024) + b"\r\nContent-Length: 2\r\n\r\nab"
        for i in range(0, len(head), 100):
            ok.sendall(head[i:i + 100])
        ok.settimeout(10)
        assert b" 200 " in ok.recv(4096)
        # and the count starts again with each request on a kept connection
        for _ in range(4):
            assert b" 200 " in _request(ok, b"p" * 3000)
        ok.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_many_requests_on_one_connection_are_each_counted_on_their_own(http):
    """Each request's head counts anew: sixty 300-byte heads on one kept-alive connection (18 KB in all)
    against an 8 KiB bound are all served."""
    srv = _server(http, max_header_bytes=8 * 1024)
    try:
        sock = _connect(srv)
        for i in range(60):
            got = _request(sock, headers=b"X-Pad: " + b"p" * 200 + b"\r\n")
            assert b" 200 " in got, (i, got[:80])
        sock.close()
    finally:
        srv.stop()


_PAD = b"X-Pad: " + b"p" * (32 * 1024) + b"\r\n"
_TLS_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40
_REFUSED_HEADS = {  # why -> (what a client sent, the path the server's refusal is told)
    Refused.HEADERS_TOO_LARGE: [
        (b"POST /sessions/s1/v1/messages?beta=true HTTP/1.1\r\nHost: x\r\n" + _PAD + b"\r\n",  # in one read
         "/sessions/s1/v1/messages"),
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + _PAD, "/health"),                          # never ends
        (b"GET /" + b"a" * (16 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n", None)],           # a huge path
    Refused.BAD_REQUEST: [
        (b"POST /sessions/s1/v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
         "/sessions/s1/v1/messages"),                                                        # a bad header
        (b"GET /health HTTP/9.x\r\nHost: x\r\n\r\n", "/health"),                            # a bad version
        (_TLS_HELLO, None),                                                                  # not HTTP at all
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
         "/v1/chat/completions")],                                                           # a bad chunk size
}


@pytest.mark.parametrize("why", list(Refused), ids=lambda why: why.name)
@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_refused_request_gets_the_servers_own_answer_naming_the_path_when_known(http, why):
    """Headers over the limit and a request the parser cannot read (in its head or in its body's framing)
    are answered in the server's words, told the path where the request line gave one, after the server's
    default headers; the connection is closed and the next one is served."""
    told = []

    def refuse(path, what):
        told.append((path, what))
        return 400, [(b"content-type", b"application/json"), (b"x-should-retry", b"false")], b'{"error": "no"}'

    srv = _server(http, refuse, max_header_bytes=8 * 1024)
    try:
        for head, _ in _REFUSED_HEADS[why]:
            closed, got = _refused(srv, head)
            status, headers, body = _split_answer(got)
            assert closed and status == b"HTTP/1.1 400 Bad Request" and body == b'{"error": "no"}', got[:200]
            assert list(headers)[:2] == [b"date", b"server"] and headers[b"server"] == b"uvicorn"
            assert {k: v for k, v in headers.items() if k not in (b"date", b"server")} == {
                b"content-type": b"application/json", b"x-should-retry": b"false", b"content-length": b"15",
                b"connection": b"close"}
        assert told == [(path, why) for _, path in _REFUSED_HEADS[why]]
        ok = _connect(srv)
        assert b" 200 " in _request(ok)
        ok.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_request_the_parser_refuses_gets_uvicorns_plain_answer_by_default(http):
    """A server that words nothing (the engine server) answers as uvicorn's httptools protocol always did,
    byte for byte but the date: 400, ``Invalid HTTP request received.`` as plain text, the connection closed
    (with h11 too, which sent no date, server or content-length)."""
    srv = _server(http)
    try:
        for head, _ in _REFUSED_HEADS[Refused.BAD_REQUEST]:
            closed, got = _refused(srv, head)
            status, headers, body = _split_answer(got)
            assert closed and status == b"HTTP/1.1 400 Bad Request", got[:200]
            assert body == b"Invalid HTTP request received." and list(headers) == [
                b"date", b"server", b"content-type", b"content-length", b"connection"]
            assert (headers[b"server"], headers[b"content-type"], headers[b"content-length"],
                    headers[b"connection"]) == (b"uvicorn", b"text/plain; charset=utf-8", b"30", b"close")
    finally:
        srv.stop()


async def _answers_at_once(scope, receive, send):
    """Answers before reading the request's body."""
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("http", ["h11", "httptools"])
def test_a_body_the_parser_refuses_after_its_answer_began_only_closes_the_connection(http):
    """The answer to that request already went out: a refusal cannot replace it, and is not sent after it."""
    if http == "httptools":
        pytest.importorskip("httptools")
    told = []
    srv = UvicornServer(_answers_at_once, name="early", http=http,
                        refuse_head=lambda path, why: told.append(why) or (400, [], b"no"))
    srv.start_background()
    try:
        sock = _connect(srv)
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        sock.settimeout(10)
        got = b""
        while not got.endswith(b"ok"):
            got += sock.recv(4096)
        sock.sendall(b"zz\r\nab\r\n")
        closed, rest = _read_until_closed(sock, 10)
        assert got.startswith(b"HTTP/1.1 200 OK") and closed and rest == b"" and told == []
        sock.close()
    finally:
        srv.stop()
