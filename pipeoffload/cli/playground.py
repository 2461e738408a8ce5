"""``pipeoffload playground``: serve the interactive schedule and memory explorer on 127.0.0.1."""
from __future__ import annotations

import argparse

from pipeoffload.cli.common import positive_int


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("playground", help="interactive schedule and memory explorer in the browser (local)")
    parser.add_argument("--port", type=positive_int, default=8000, help="port on 127.0.0.1 (default 8000)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeoffload.web.server import make_server

    server = make_server(args.port)
    print(f"pipeoffload playground on http://127.0.0.1:{server.server_address[1]}/  (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped")
    finally:
        server.server_close()
    return 0
