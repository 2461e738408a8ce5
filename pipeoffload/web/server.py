"""The playground's server: static files plus a JSON API over ``simulate``, on 127.0.0.1 only.

- ``GET /api/simulate?family=1f1b&ranks=8...`` returns exactly the object ``pipeoffload simulate --json``
  prints for the same flags, its notes naming the parameters (``time_f=1``, not ``--time-f 1``): each query
  parameter is the same-named field of the service's ``SimulateRequest``, checked by the same code as the
  flag; a parameter given twice, or given empty
  (``ranks=`` is ``--ranks ''``), is refused, and one left out takes its default.
- ``GET /api/chart?...`` returns ``{"command", "result", "chart"}``: the command line, that object, and the
  chart data (``viz.chartdata``) in a compact form the front end draws.
- ``GET /api/families`` lists the schedule families, each with the options a request can set; it takes no
  parameters.
- ``POST /api/trace`` with a runtime trace (the Chrome trace JSON ``python -m pipeoffload.runtime --trace`` or
  ``runtime.write_chrome_trace`` writes) as the body returns the measured step and its simulation with the
  run's own durations, read by the code ``pipeoffload trace compare`` uses (``viz.trace_compare``), as two
  compact charts and a per-rank table. The body is at most ``MAX_TRACE_BYTES`` and strict JSON; its
  actions must be a whole run's schedule (``load_measured`` validates it).
Bad input answers 400 with ``{"error": <one line naming the parameter, the value and the rule>, "status": 400}``
(every error has that shape, http.server's own ones included; a method other than GET and POST is 405
with ``Allow: GET, POST``); a
request bigger than the size limit answers 413 before simulating, so one request cannot hold the server for long. ``/api/chart``,
which the page uses, sends the same error object with status 200 (and the HTTP status inside), so the
browser does not log a failed load for a message meant for the user.

Hardening, for a server any web page the user visits could try to reach: a request whose Host header is
not this server's own address is refused (a DNS-rebinding page would send its own name); every answer
carries a Content-Security-Policy (this origin only) and ``nosniff``; at most ``max_threads`` requests are
served at once, the rest wait in a deep listen queue (not reset); a connection idle for ``idle_timeout``
seconds (half-open, or a client that never sends) is closed, so idle sockets cannot hold threads; an upload's
body must arrive within ``BODY_DEADLINES`` idle timeouts (a trickling sender is answered 408).
"""
from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pipeoffload.errors import ConfigError, ScheduleError
from pipeoffload.policies import OffloadPolicy, RecomputePolicy
from pipeoffload.schedules import estimated_work, get_spec, schedule_specs
from pipeoffload.service import SimulateRequest, SimulateResult, simulate, strict_json
from pipeoffload.service.checks import checked, finite_at_least, int_at_least, readable_count
from pipeoffload.viz.chartdata import COLOURS, LABELS, ChartData, chart_data
from pipeoffload.viz.trace_compare import (
    compare_trace,
    load_measured,
    measured_chart,
    not_strict_json,
    read_trace_json,
)

log = logging.getLogger(__name__)

def _policy(parse: Callable[[str], Any]) -> Callable[[str], str]:
    """A policy's text, refused when ``parse`` refuses it, in the words that name the parameter (the query's
    parameters are the request's fields): ``offload=budget:abc`` answers ``offload='budget:abc': 'abc' is
    not a number; ...``, where the command line says ``--offload 'budget:abc': ...``."""
    def check(text: str) -> str:
        parse(text)
        return text
    return check


# Query parameter -> how its text becomes a value of the same-named ``SimulateRequest`` field: the checks
# the CLI's flags use, on the text as given. An empty value is refused as the flag refuses it (`ranks=` is
# `--ranks ''`); a parameter left out takes the default (the page leaves out the boxes left empty).
PARAMS: dict[str, Callable[[str], Any]] = {
    "ranks": int_at_least, "microbatches": int_at_least, "stages_per_rank": int_at_least, "group_size": int_at_least,
    "time_f": finite_at_least, "time_i": finite_at_least, "time_w": finite_at_least, "p2p_time": finite_at_least,
    "offload_ratio": finite_at_least, "plan_ratio": finite_at_least, "max_stall": finite_at_least,
    "offload": _policy(OffloadPolicy.parse), "recompute": _policy(RecomputePolicy.parse),
    "backward": str,
}
MAX_WORK = 120_000  # schedules.estimated_work: d=64, m=256 of zb-v (v=2) is ~105,000, about 2 s
# Planning offload makes a simulation about this many times as much work (measured: zb-v, d 16-32, m 64-128,
# offload all against none: 10 to 13 times as long).
OFFLOAD_WORK_FACTOR = 12
MAX_QUERY = 2_000  # characters
MAX_TRACE_BYTES = 32 * 2**20  # a runtime trace's body; app.js refuses a bigger file before sending it
TRACE_HINT = "expected the Chrome trace JSON of a run (python -m pipeoffload.runtime --trace FILE)"
MAX_THREADS = 32  # requests served at once; more wait in the listen queue
BACKLOG = 1_024  # connections the kernel queues before resetting new ones
IDLE_TIMEOUT_S = 10.0  # a connection silent this long is closed
BODY_DEADLINES = 6  # an upload's whole body must arrive within this many idle timeouts (60 s)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
ALLOWED_METHODS = "GET, POST"  # every other method is answered 405 with this Allow header
_STATIC = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
           "/style.css": ("style.css", "text/css")}


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def request_from_query(query: dict[str, list[str]]) -> SimulateRequest:
    """The service's request for a query: each parameter at most once, checked like the CLI's flag."""
    unknown = sorted(set(query) - set(PARAMS) - {"family"})
    if unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown parameter(s) {', '.join(unknown)}; "
                           f"known: family, {', '.join(PARAMS)}")
    repeated = sorted(name for name, values in query.items() if len(values) > 1)
    if repeated:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"parameter(s) {', '.join(repeated)} given more than once; "
                           "give each at most once")
    values = {name: checked(name, PARAMS[name], texts[0]) for name, texts in query.items() if name in PARAMS}
    return SimulateRequest(family=query.get("family", [""])[0].strip(), **values)


def check_size(req: SimulateRequest) -> None:
    """Refuse what would take more than a moment, before generating anything: all the work the request
    implies (its actions and its per-stage work, so many ranks with one microbatch count too)."""
    try:
        ranks, m, v = req.sizes()
        work = estimated_work(get_spec(req.family), ranks, m, v)
        if req.offload.strip() not in ("", "none"):
            work *= OFFLOAD_WORK_FACTOR
    except ConfigError:
        return  # an unknown family: simulate gives its message
    if work > MAX_WORK:
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"ranks={ranks}, microbatches={m}, stages per rank={v}: about {readable_count(work)} actions of work, "
                           f"over the playground's limit of {MAX_WORK:,}; use `pipeoffload simulate` for bigger "
                           "pipelines")


def simulate_query(query: dict[str, list[str]]) -> SimulateResult:
    """The simulation a query asks for; RequestError with the service's one-line message when it is bad."""
    try:
        req = request_from_query(query)
        check_size(req)
        return simulate(req)
    except (ConfigError, ScheduleError) as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, str(err).splitlines()[0]) from None


def policy_line(result: SimulateResult) -> str:
    """The line ``pipeoffload simulate`` prints under its table for an offload or recompute policy (what was
    offloaded, what stayed on the device and why, the planned peak); empty without one, as the CLI prints none."""
    report = result.report
    if report.policy.kind == "none" and report.recompute == RecomputePolicy():
        return ""
    return report.summary()


def compact_chart(data: ChartData) -> dict:
    """Chart data with boxes and curves as arrays: a d=16, m=64 chart in a few hundred kilobytes."""
    return {
        "title": data.title, "summary": data.summary, "time_unit": data.time_unit, "memory_unit": data.memory_unit,
        "makespan": data.makespan, "ranks": data.ranks, "stages_per_rank": data.stages_per_rank,
        "copy_lanes": data.copy_lanes, "kinds": list(data.kinds),
        "colours": {k.value: c for k, c in COLOURS.items()}, "labels": {k.value: n for k, n in LABELS.items()},
        "box_fields": ["rank", "lane", "kind", "shade", "microbatch", "start", "end", "action", "stage"],
        "boxes": [[b.rank, b.lane, b.kind, b.shade, b.microbatch, b.start, b.end, b.action, b.stage]
                  for b in data.boxes],
        "device": [{"rank": c.rank, "peak": c.peak, "points": c.points} for c in data.device],
        "host": [{"rank": c.rank, "peak": c.peak, "points": c.points} for c in data.host],
    }


def route(path: str, query: dict[str, list[str]]) -> tuple[HTTPStatus, str, bytes]:
    """(status, content type, body) for a GET; the handler only does the I/O."""
    if path in _STATIC:
        name, kind = _STATIC[path]
        body = resources.files("pipeoffload.web").joinpath("static", name).read_bytes()
        return HTTPStatus.OK, f"{kind}; charset=utf-8", body
    try:
        if path == "/api/families":
            if query:
                raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown parameter(s) {', '.join(sorted(query))}; "
                                   "/api/families takes none")
            # options: the family's own parameters a request can set (a generator's other keyword
            # arguments, such as zb's memory_limit, are not reachable from here or the command line)
            out: Any = [{"name": s.name, "aliases": list(s.aliases), "summary": s.summary, "stages_per_rank": s.default_stages_per_rank(),
                         "fixed_stages_per_rank": s.fixed_stages_per_rank,
                         "options": [o for o in s.options if o in PARAMS]}
                        for s in schedule_specs()]
        elif path == "/api/simulate":
            out = simulate_query(query).as_dict()
        elif path == "/api/chart":
            result = simulate_query(query)
            out = {"command": shlex.join(result.request.command()), "result": result.as_dict(),
                   "policy_line": policy_line(result),
                   "chart": compact_chart(chart_data(result.timeline, result.title(), result.time_unit))}
        else:
            raise RequestError(HTTPStatus.NOT_FOUND, f"no such page {path!r}; the playground is at /")
    except RequestError as err:
        # The page's own endpoint answers 200: a message for the user is a normal outcome, not a failed load.
        status = HTTPStatus.OK if path == "/api/chart" else err.status
        return status, "application/json", strict_json({"error": str(err), "status": int(err.status)}).encode()
    return HTTPStatus.OK, "application/json", strict_json(out).encode()


def _strict_constant(name: str) -> Any:
    raise not_strict_json(name)  # the words `trace compare` uses for the same file


def _trace_json(body: bytes) -> Any:
    """The uploaded file as strict JSON; RequestError saying what the file is instead."""
    try:
        return read_trace_json(body.decode("utf-8"), parse_constant=_strict_constant)
    except UnicodeDecodeError:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the file is not UTF-8 text; {TRACE_HINT}") from None
    except ConfigError as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{err}; {TRACE_HINT}") from None
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and body.lstrip().startswith(b"{"):
            raise RequestError(HTTPStatus.BAD_REQUEST, "the file has one JSON object per line, like a run's "
                               f"metrics.jsonl (load that with the metrics.jsonl button); {TRACE_HINT}") from None
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the file is not JSON ({err.msg} at line {err.lineno} "
                                                   f"column {err.colno}); {TRACE_HINT}") from None
    except (ValueError, RecursionError) as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the file is not strict JSON ({err}); {TRACE_HINT}") from None


def trace_answer(body: bytes) -> dict:
    """The measured step of a runtime trace beside its simulation with the run's own durations: what
    ``pipeoffload trace compare`` computes, as the playground's charts. RequestError for a wrong file."""
    data = _trace_json(body)
    try:
        run = load_measured(data)  # checks it is a whole run's schedule, as trace compare does
        actions = sum(len(row) for row in run.rows)
        if actions > MAX_WORK:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the trace has {actions:,} actions, over the "
                               f"playground's limit of {MAX_WORK:,}; use `pipeoffload trace compare`")
        merged, timeline, run = compare_trace(data, run)
    except (ConfigError, ScheduleError) as err:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"{str(err).splitlines()[0]}; {TRACE_HINT}") from None
    measured, other = measured_chart(run), merged["otherData"]
    simulated = chart_data(timeline, "simulated with the run's measured durations", "s")
    rows = [r | {"measured_peak_mib": measured.device[r["rank"]].peak,
                 "simulated_peak_rank_units": simulated.device[r["rank"]].peak} for r in other["per_rank"]]
    return {"ranks": timeline.schedule.num_ranks, "measured_step_s": other["measured_step_s"],
            "start_skew_s": other["start_skew_s"],
            "simulated_makespan_s": other["simulated_makespan_s"], "has_memory": bool(run.memory),
            "per_rank": rows, "measured": compact_chart(measured), "simulated": compact_chart(simulated)}


class Handler(BaseHTTPRequestHandler):
    server_version = "pipeoffload-playground"
    server: PlaygroundServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout)  # a silent client's read raises, closing it

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._send(*self._answer())

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self._send(*self._answer_post())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (a method without a ``do_`` handler, a malformed request line or
        header) in the shape of every other answer: JSON ``{"error", "status"}`` with the security
        headers, not its HTML page. Any method but GET and POST is 405 with ``Allow``, after the Host check."""
        self.close_connection = True  # a body this handler did not read must not be taken for the next request
        allow = None
        if code == HTTPStatus.NOT_IMPLEMENTED:  # http.server's answer to a method it has no do_ handler for
            refused = self._foreign_host() if getattr(self, "headers", None) is not None else None
            if refused:  # the Host check comes first, as for GET and POST
                self.log_error("answered %d: a foreign Host", int(refused[0]))
                self._send(*refused)
                return
            code, allow = HTTPStatus.METHOD_NOT_ALLOWED, ALLOWED_METHODS
            message = (f"method {str(self.command)[:20]!r} is not allowed; the playground answers GET, and POST at "
                       "/api/trace")
        status = HTTPStatus(code)
        self.log_error("answered %d: %s", int(status), message or status.phrase)
        self._send(status, "application/json", strict_json({"error": message or status.phrase,
                                                            "status": int(status)}).encode(), allow)

    def _send(self, status: HTTPStatus, kind: str, body: bytes, allow: str | None = None) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if allow:
                self.send_header("Allow", allow)
            if self.close_connection:
                self.send_header("Connection", "close")
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            if getattr(self, "command", None) != "HEAD":  # a HEAD answer has the headers of its body and no body
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # the page moved on and aborted this request
            log.info("client left before %s was answered", self.path)

    def _foreign_host(self) -> tuple[HTTPStatus, str, bytes] | None:
        host = self.headers.get("Host", "")
        if host.lower() not in self.server.allowed_hosts:
            return _error(HTTPStatus.FORBIDDEN, f"Host {host!r} is not this playground's address; open "
                                                f"http://{self.server.allowed_hosts[0]}/")
        return None

    def _answer_post(self) -> tuple[HTTPStatus, str, bytes]:
        """A runtime trace to draw. A body that is not read (refused before reading) closes the connection."""
        refused = self._foreign_host()
        if refused or urlsplit(self.path).path != "/api/trace":
            self.close_connection = True
            return refused or _error(HTTPStatus.NOT_FOUND, f"no POST at {self.path[:80]!r}; POST a trace to /api/trace")
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            return _error(HTTPStatus.LENGTH_REQUIRED, "give the trace's size in Content-Length")
        if int(length) > MAX_TRACE_BYTES:
            self.close_connection = True
            return _error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the file is {int(length):,} bytes, over the "
                          f"playground's limit of {MAX_TRACE_BYTES:,}; use `pipeoffload trace compare`")
        body = self._read_body(int(length))
        if body is None:
            self.close_connection = True
            return _error(HTTPStatus.REQUEST_TIMEOUT, f"the upload took over {BODY_DEADLINES:g} x "
                          f"{self.server.idle_timeout:g} s; send the file at once")
        try:
            return HTTPStatus.OK, "application/json", strict_json(trace_answer(body)).encode()
        except RequestError as err:  # answered 200 like /api/chart: a message for the user, not a failed load
            return HTTPStatus.OK, "application/json", strict_json({"error": str(err), "status": int(err.status)}).encode()
        except Exception as err:  # a bug must not take the page down
            log.exception("playground trace upload failed")
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {err}")

    def _read_body(self, length: int) -> bytes | None:
        """The body, or None when it trickles in past its deadline: the idle timeout bounds each read, this
        bounds the whole upload, so a slow sender cannot hold a thread for long."""
        deadline = time.monotonic() + BODY_DEADLINES * self.server.idle_timeout
        chunks, left = [], length
        while left > 0:
            if time.monotonic() > deadline:
                return None
            chunk = self.rfile.read1(min(left, 1 << 16))
            if not chunk:
                break  # the client closed early: what came is a truncated file, answered as such
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _answer(self) -> tuple[HTTPStatus, str, bytes]:
        refused = self._foreign_host()
        if refused:
            return refused
        if len(self.path) > MAX_QUERY:
            return _error(HTTPStatus.REQUEST_URI_TOO_LONG, f"request longer than {MAX_QUERY} characters")
        parts = urlsplit(self.path)
        try:
            return route(parts.path, parse_qs(parts.query, keep_blank_values=True))
        except Exception as err:  # a bug must not take the page down: answer 500 with the message
            log.exception("playground request %s failed", self.path)
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {err}")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        log.info("%s %s", self.address_string(), format % args)


def _error(status: HTTPStatus, message: str) -> tuple[HTTPStatus, str, bytes]:
    return status, "application/json", strict_json({"error": message, "status": int(status)}).encode()


class PlaygroundServer(ThreadingHTTPServer):
    """One thread per request, at most ``max_threads`` at once: the accept loop waits for a free slot,
    and the connections behind it wait in the listen queue (``BACKLOG``) instead of being reset."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address: tuple[str, int], max_threads: int, idle_timeout: float) -> None:
        self.idle_timeout = idle_timeout
        self._slots = threading.BoundedSemaphore(max_threads)
        super().__init__(address, Handler)
        port = self.server_address[1]
        names = dict.fromkeys([address[0], "127.0.0.1", "localhost", "[::1]"])
        self.allowed_hosts = [f"{name}:{port}" for name in names]

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def make_server(port: int = 8000, host: str = "127.0.0.1", *, max_threads: int = MAX_THREADS,
                idle_timeout: float = IDLE_TIMEOUT_S) -> PlaygroundServer:
    """A server bound to ``host:port`` (port 0: any free port); call ``serve_forever`` on it."""
    try:
        return PlaygroundServer((host, port), max_threads, idle_timeout)
    except OSError as err:
        raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror}); "
                          "pick another port with --port") from None
