"""The playground's server without a browser: the JSON API is `simulate --json`, errors are the CLI's
messages, large requests are refused with the limit, static files are served."""
import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipeoffload import schedules
from pipeoffload.web.server import MAX_WORK, PlaygroundServer, make_server
from tests.conftest import run_cli


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize("query,argv", [
    ("family=1f1b&ranks=4&microbatches=8", ["1f1b", "-d", "4", "-m", "8"]),
    ("family=group-interleaved&ranks=4&microbatches=8&group_size=2&offload=all&offload_ratio=0.5&time_w=0.5",
     ["group-interleaved", "-d", "4", "-m", "8", "-g", "2", "--offload", "all", "--offload-ratio", "0.5",
      "--time-w", "0.5"]),
    ("family=zb-v&ranks=4&microbatches=8&recompute=first:1",
     ["zb-v", "-d", "4", "-m", "8", "--recompute", "first:1"]),
    ("family=zb-h1&ranks=4&microbatches=8&offload=all&offload_ratio=0.4&plan_ratio=1",
     ["zb-h1", "-d", "4", "-m", "8", "--offload", "all", "--offload-ratio", "0.4", "--plan-ratio", "1"]),
    ("family=zb-v&ranks=4&microbatches=6&offload=all&offload_ratio=0.7&max_stall=10",
     ["zb-v", "-d", "4", "-m", "6", "--offload", "all", "--offload-ratio", "0.7", "--max-stall", "10"]),
])
def test_api_returns_exactly_simulate_json(base: str, query: str, argv: list[str]) -> None:
    status, body = _get(f"{base}/api/simulate?{query}")
    code, out, _ = run_cli("simulate", *argv, "--json")
    assert status == 200 and code == 0
    served, printed = json.loads(body), json.loads(out)
    # the one difference: the units note names the time as the playground's parameter, not as the flag
    assert served["units"].pop("time") == printed["units"].pop("time").replace("(--time-f 1)", "(time_f=1)")
    assert served == printed


@pytest.mark.parametrize("param,flag,value", [
    ("ranks", "--ranks", "0"), ("ranks", "--ranks", "1e"), ("microbatches", "--microbatches", "x"),
    ("time_f", "--time-f", "inf"), ("p2p_time", "--p2p-time", "nan"), ("offload_ratio", "--offload-ratio", "-1"),
    ("plan_ratio", "--plan-ratio", "-2"), ("max_stall", "--max-stall", "-1"),
])
def test_bad_input_is_the_cli_message(base: str, param: str, flag: str, value: str) -> None:
    """The same check refuses a value in the query and in the flag, in the same words after the name."""
    status, body = _get(f"{base}/api/simulate?family=1f1b&offload=all&{param}={value}")
    code, _, err = run_cli("simulate", "1f1b", "--offload", "all", f"{flag}={value}")
    assert status == 400 and code == 2
    message = json.loads(body)["error"]
    assert message.startswith(f"{param}: ") and err.rstrip().endswith(message.removeprefix(f"{param}: "))
    assert value in message and len(err.splitlines()) == 1


@pytest.mark.parametrize("param,value", [("offload", "budget:abc"), ("offload", "sometimes"),
                                         ("recompute", "xx"), ("recompute", "first:0")])
def test_a_bad_policy_names_its_parameter_then_the_cli_words(base: str, param: str, value: str) -> None:
    """A policy's message names the box it came from, the query's parameter (``offload='budget:abc': 'abc'
    is not a number``), where the command line names its flag (``--offload 'budget:abc': ...``), in the same
    words after the name."""
    status, body = _get(f"{base}/api/chart?family=1f1b&{param}={value}")
    code, _, err = run_cli("simulate", "1f1b", f"--{param}", value)
    message = json.loads(body)["error"]
    assert status == 200 and code == 2 and message.startswith(f"{param}={value!r}: ")
    assert f"--{param} {value!r}: " in err and len(err.splitlines()) == 1
    assert err.rstrip().endswith(message.removeprefix(f"{param}={value!r}")) and "valid forms" in message


def test_the_chart_answer_has_the_cli_policy_line(base: str) -> None:
    """What `simulate` prints under its table for a policy (offloaded, kept on the device and why, the
    planned peak) is in the page's answer word for word, and empty without a policy, as the CLI prints none."""
    status, body = _get(f"{base}/api/chart?family=zb-h1&ranks=4&microbatches=8&offload=all")
    code, out, _ = run_cli("simulate", "zb-h1", "-d", "4", "-m", "8", "--offload", "all")
    assert status == 200 and code == 0
    assert json.loads(body)["policy_line"] == out.splitlines()[-1] and "offloaded between I and W" in out
    assert json.loads(_get(f"{base}/api/chart?family=1f1b&ranks=4&microbatches=8")[1])["policy_line"] == ""


def test_an_infinite_offload_budget_is_refused_not_a_500(base: str) -> None:
    status, body = _get(f"{base}/api/simulate?family=1f1b&offload=budget:1e999rank")
    assert status == 400 and "'budget:1e999rank': inf must be a finite number >= 0" in json.loads(body)["error"]


def test_bad_query_is_refused(base: str) -> None:
    status, body = _get(f"{base}/api/chart?family=nope")  # the page's endpoint: 200 with the message
    assert status == 200 and "unknown schedule 'nope'" in json.loads(body)["error"]
    status, body = _get(f"{base}/api/simulate?family=1f1b&colour=red")
    assert status == 400 and "unknown parameter(s) colour" in json.loads(body)["error"]
    status, body = _get(f"{base}/api/simulate?family=1f1b&ranks=2&ranks=8")  # not silently the first
    assert status == 400 and "ranks given more than once" in json.loads(body)["error"]
    status, body = _get(f"{base}/api/simulate?family=--help")  # a name, never a flag of a parser
    assert status == 400 and "unknown schedule '--help'" in json.loads(body)["error"]


def test_large_request_is_refused_with_the_limit(base: str) -> None:
    status, body = _get(f"{base}/api/simulate?family=1f1b&ranks=64&microbatches=4096")
    assert status == 413 and f"{MAX_WORK:,}" in json.loads(body)["error"]
    status, body = _get(f"{base}/api/simulate?family=1f1b&ranks=8192&microbatches=1")  # per-stage work counts
    assert status == 413 and f"{MAX_WORK:,}" in json.loads(body)["error"]
    status, body = _get(f"{base}/api/simulate?family=zb-v&ranks=64&microbatches=256&offload=all")  # offload counts
    assert status == 413 and f"{MAX_WORK:,}" in json.loads(body)["error"]
    status, _ = _get(f"{base}/api/simulate?family=1f1b&offload=" + "x" * 3000)
    assert status == 414


def test_a_huge_rank_count_says_its_work_in_a_readable_number(base: str) -> None:
    """The estimate of 10**14 ranks and microbatches is about 2e28 actions: "about 2.0e28", in the page's
    message and the command line's alike, never a 29-digit number; small counts keep their separators."""
    huge = "100000000000000"
    status, body = _get(f"{base}/api/simulate?family=1f1b&ranks={huge}&microbatches={huge}")
    message = json.loads(body)["error"]
    assert status == 413 and "about 2.0e28 actions of work" in message, message
    code, _, err = run_cli("simulate", "1f1b", "--ranks", huge, "--microbatches", huge)
    assert code != 0 and "about 2.0e28 actions of work" in err, err
    status, body = _get(f"{base}/api/simulate?family=1f1b&ranks=8192&microbatches=1")
    assert "about 425,984 actions of work" in json.loads(body)["error"]


def test_static_files_and_chart(base: str) -> None:
    status, page = _get(f"{base}/")
    assert status == 200 and b"/app.js" in page and b"http" not in page.replace(b"http://www.w3.org", b"")
    assert _get(f"{base}/app.js")[0] == _get(f"{base}/style.css")[0] == 200
    assert _get(f"{base}/nothing")[0] == 404
    status, body = _get(f"{base}/api/chart?family=1f1b&ranks=3&microbatches=4")
    chart = json.loads(body)["chart"]
    assert status == 200 and chart["ranks"] == 3 and len(chart["boxes"]) == 3 * 4 * 2 and len(chart["device"]) == 3
    assert chart["title"].endswith(", offload ratio k=1.49")  # the header says what the copies cost
    families = json.loads(_get(f"{base}/api/families")[1])
    assert "group-interleaved" in {f["name"] for f in families}


def test_port_in_use_is_a_config_error(base: str) -> None:
    from pipeoffload.errors import ConfigError

    port = int(base.rsplit(":", 1)[1])
    with pytest.raises(ConfigError, match="pick another port"):
        make_server(port)


def _serve(**options: float) -> tuple[str, PlaygroundServer]:
    server = make_server(0, **options)  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def _stop(server: PlaygroundServer) -> None:
    server.shutdown()
    server.server_close()


def test_200_concurrent_requests_on_a_fresh_server_all_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh process: the schedule registry fills on the first requests, from many threads at once."""
    monkeypatch.setattr(schedules, "_REGISTRY", {})
    url, server = _serve()
    paths = ["/api/families", "/api/simulate?family=1f1b&ranks=2&microbatches=2", "/api/chart?family=zb-v&ranks=2"]
    with ThreadPoolExecutor(200) as pool:
        statuses = list(pool.map(lambda i: _get(url + paths[i % 3])[0], range(200)))
    _stop(server)
    assert statuses == [200] * 200


def test_every_answer_has_the_security_headers_and_a_foreign_host_is_refused(base: str) -> None:
    with urllib.request.urlopen(base + "/") as response:
        headers = response.headers
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    rebound = urllib.request.Request(base + "/api/families", headers={"Host": "evil.example:80"})
    try:
        urllib.request.urlopen(rebound)
        status, body = 200, b"{}"
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read()
    assert status == 403 and "Host 'evil.example:80'" in json.loads(body)["error"]
    port = base.rsplit(":", 1)[1]
    local = urllib.request.Request(base + "/api/families", headers={"Host": f"localhost:{port}"})
    assert urllib.request.urlopen(local).status == 200


def test_idle_connections_are_closed_and_hold_at_most_max_threads() -> None:
    url, server = _serve(max_threads=2, idle_timeout=0.5)
    port = int(url.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    try:
        time.sleep(0.2)  # let the server accept what it will
        serving = [t for t in threading.enumerate() if "process_request_thread" in t.name]
        assert len(serving) <= 2
        for sock in idle:  # each is closed by the server (b""), not left open until the client gives up
            sock.settimeout(30)
            assert sock.recv(1) == b""
        assert _get(url + "/api/families")[0] == 200
    finally:
        for sock in idle:
            sock.close()
        _stop(server)


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_simulated_trace_is_not_taken_for_a_run(base: str, tmp_path: Path) -> None:
    """`simulate --trace` writes the same layout with lanes where a run has ranks: named, not misread."""
    trace = tmp_path / "sim.json"
    assert run_cli("simulate", "1f1b", "-d", "2", "-m", "4", "--trace", str(trace))[0] == 0
    status, answer = _post(base + "/api/trace", trace.read_bytes())
    assert status == 200 and "this trace holds a simulated timeline" in answer["error"]
    code, _, err = run_cli("trace", "compare", str(trace), "-o", str(tmp_path / "merged.json"))
    assert code == 2 and "this trace holds a simulated timeline" in err and not (tmp_path / "merged.json").exists()


@pytest.mark.parametrize("body,expected", [
    (b"", "the file is not JSON (Expecting value at line 1 column 1)"),
    (b"\xff\xfe{", "the file is not UTF-8 text"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": NaN}]}', "the file is not strict JSON (NaN is not JSON"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": Infinity}]}', "not strict JSON (Infinity is not JSON"),
    (b'{"step": 1, "loss": 5.0}\n{"step": 2}\n', "one JSON object per line, like a run's metrics.jsonl"),
    (b'{"traceEvents": 5}', "not a Chrome trace: expected an object with a 'traceEvents' list"),
    (b'{"traceEvents": [5]}', "trace event 0 is int; expected an object"),
    (b'{"traceEvents": [{"ph": "X", "name": "hello", "ts": 0}]}', "trace event 0 ('hello'): cannot parse action 'hello'"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": "soon"}]}', "'ts' is 'soon'; expected a finite number >= 0"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": 0}, {"ph": "X", "name": "0F1", "ts": 1}, '
     b'{"ph": "X", "name": "0F2", "ts": 2}, {"ph": "X", "name": "2F0", "ts": 3}]}',
     "the trace's actions are not a schedule: stages used are not 0..S-1"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F0", "ts": 0}, {"ph": "X", "name": "2F0", "ts": 1}]}',
     "an action numbers a stage or microbatch 2 but the trace has only 2 actions, so it is not a whole run"),
    (b'{"traceEvents": [{"ph": "X", "name": "0F99999", "ts": 0}]}', "is not a whole run"),
    (b'{"traceEvents": [{"ph": "X", "name": "0B0", "ts": 0}, {"ph": "X", "name": "0F0", "ts": 1}]}',
     "not the schedule of a run: rank 0, step 0, action 0B0: backward of stage 0, microbatch 0 runs before its F"),
    (b"[" * 100_000, "the file is not strict JSON"),
])
def test_a_wrong_trace_file_is_one_line_naming_the_fault(base: str, body: bytes, expected: str) -> None:
    """Answered 200 with the error (the page's own endpoint, like /api/chart), never a 500 or a traceback."""
    status, answer = _post(base + "/api/trace", body)
    assert status == 200 and answer["status"] in (400, 413), answer
    assert expected in answer["error"] and "\n" not in answer["error"], answer
    assert "python -m pipeoffload.runtime --trace FILE" in answer["error"]


def test_trace_uploads_are_bounded_and_only_at_their_address(base: str) -> None:
    from pipeoffload.web.server import MAX_TRACE_BYTES

    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # refused before the body is sent
        sock.sendall(f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Content-Length: {MAX_TRACE_BYTES + 1}\r\n\r\n".encode())
        reply = sock.makefile("rb").read().decode()
    assert reply.startswith("HTTP/1.0 413") and f"limit of {MAX_TRACE_BYTES:,}" in reply
    assert _post(base + "/api/simulate", b"{}")[0] == 404
    assert _post(base + "/api/trace", b"{}", {"Host": "evil.example:80"})[0] == 403
    script = (Path(__file__).parents[2] / "pipeoffload" / "web" / "static" / "app.js").read_text()
    assert f"const MAX_TRACE_BYTES = {MAX_TRACE_BYTES};" in script  # the page refuses what the server would


def test_a_trickled_upload_is_cut_off_at_its_deadline() -> None:
    """Each read waits at most the idle timeout; the whole body has BODY_DEADLINES of them, so a sender
    that keeps the connection alive one byte at a time cannot hold a thread for long."""
    from pipeoffload.web.server import BODY_DEADLINES

    url, server = _serve(idle_timeout=0.3)
    port = int(url.rsplit(":", 1)[1])
    reply = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(f"POST /api/trace HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 1000\r\n\r\n".encode())
            for _ in range(int(BODY_DEADLINES * 0.3 / 0.1) + 50):  # 1 byte every 0.1 s, past the deadline
                if select.select([sock], [], [], 0.1)[0]:  # the answer came: stop sending
                    break
                sock.sendall(b" ")
            reply = sock.makefile("rb").read()  # the server closes after answering
    finally:
        _stop(server)
    assert reply.startswith(b"HTTP/1.0 408") and b"send the file at once" in reply, reply


def _raw(base: str, method: str, path: str, body: bytes = b"", host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request sent as written: http.client, so any method goes."""
    import http.client

    port = int(base.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Host": host} if host else {}
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("method", ["HEAD", "PUT", "OPTIONS", "DELETE", "PATCH", "BREW"])
def test_other_methods_answer_405_in_json_with_the_security_headers(base: str, method: str) -> None:
    status, headers, body = _raw(base, method, "/api/simulate?family=1f1b", b"{}" if method in ("PUT", "PATCH") else b"")
    assert status == 405 and headers["Allow"] == "GET, POST"
    assert headers["Content-Type"] == "application/json" and headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "no-referrer"
    if method == "HEAD":
        assert body == b""
    else:
        answer = json.loads(body)
        assert answer == {"error": answer["error"], "status": 405} and method in answer["error"], answer
    # a foreign Host is refused first, as for GET and POST
    status, _, _ = _raw(base, method, "/", host="evil.example:80")
    assert status == 403


def test_a_malformed_request_is_answered_in_json_with_the_security_headers(base: str) -> None:
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n")
        reply = sock.makefile("rb").read()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 431") and b"X-Content-Type-Options: nosniff" in head, reply
    assert json.loads(body) == {"error": "Too many headers", "status": 431}


def test_every_error_has_the_documented_shape(base: str) -> None:
    """{"error", "status"}: a POST elsewhere, a foreign Host, a missing page, as much as a bad value."""
    assert _post(base + "/api/x", b"{}") == (404, {"error": "no POST at '/api/x'; POST a trace to /api/trace", "status": 404})
    status, answer = _post(base + "/api/trace", b"{}", {"Host": "evil.example:80"})
    assert status == 403 and answer["status"] == 403
    status, body = _get(f"{base}/nothing")
    assert status == 404 and json.loads(body)["status"] == 404


def test_families_takes_no_parameters(base: str) -> None:
    status, body = _get(f"{base}/api/families?x=1")
    assert status == 400 and json.loads(body) == {"error": "unknown parameter(s) x; /api/families takes none",
                                                  "status": 400}


@pytest.mark.parametrize("param,flag", [("ranks", "--ranks"), ("microbatches", "--microbatches"),
                                        ("time_f", "--time-f"), ("stages_per_rank", "--stages-per-rank"),
                                        ("offload_ratio", "--offload-ratio"), ("max_stall", "--max-stall")])
def test_an_empty_number_is_refused_as_the_cli_refuses_it(base: str, param: str, flag: str) -> None:
    """`ranks=` is not the default, as `--ranks ''` is not: the page leaves out what the user left empty."""
    status, body = _get(f"{base}/api/simulate?family=1f1b&{param}=")
    code, _, err = run_cli("simulate", "1f1b", f"{flag}=")
    assert status == 400 and code == 2
    message = json.loads(body)["error"]
    assert message.startswith(f"{param}: ''") and err.rstrip().endswith(message.removeprefix(f"{param}: ")), (message, err)


def test_families_list_only_the_options_a_request_can_set(base: str) -> None:
    from pipeoffload.web.server import PARAMS

    families = json.loads(_get(f"{base}/api/families")[1])
    by_name = {f["name"]: f["options"] for f in families}
    assert by_name["zb"] == [] and by_name["zb-v"] == [] and by_name["group-interleaved"] == ["group_size", "backward"]
    assert all(option in PARAMS for f in families for option in f["options"])
