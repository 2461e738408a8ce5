"""``pipeoffload playground``: serve the interactive schedule and memory explorer on 127.0.0.1."""
from __future__ import annotations

import argparse

from pipeoffload.service.argtypes import flag_type
from pipeoffload.service.checks import int_at_least


def _port(text: str) -> int:
    port = int_at_least(text, 0)
    if port > 65535:
        raise ValueError(f"{port} is not a TCP port (1 to 65535, or 0 for any free one)")
    return port


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("playground", help="interactive schedule and memory explorer in the browser (local)")
    parser.add_argument("--port", type=flag_type(_port), default=8000, help="port on 127.0.0.1 (default 8000; 0: any free port)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.web.server import make_server

    server = make_server(args.port)
    print(f"pipeoffload playground on http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
    try:  # Ctrl-C: `main` says "interrupted" and exits 130, as every long command does
        server.serve_forever()
    finally:
        server.server_close()
    return 0
