"""`athanor dashboard`: the read-only web view of a store (`athanor.dashboard`), or its figures as PNG files."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="a read-only web view of an experiment store: runs, candidates, "
                                         "deployments, traffic; live while they are written")
    p.add_argument("--store", required=True, help="a run directory, a store file or a postgresql:// URL")
    p.add_argument("--server", default="", help="an athanor server's base URL, to show what it serves now")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", type=int, default=8300, help="the port to listen on")
    p.add_argument("--png", default="", metavar="DIR", help="instead of serving, write every figure as a PNG file "
                                                            "into DIR (needs the plot extra)")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from athanor.dashboard.app import DashboardOptions, create_app, write_pngs
    from athanor.dashboard.views import open_reader

    store = open_reader(args.store)
    if args.png:
        for path in write_pngs(store, args.png):
            print(path)
        return 0
    import uvicorn

    from athanor.commands.serve import check_port_free

    check_port_free(args.host, args.port)
    app = create_app(DashboardOptions(args.store, args.server.rstrip("/")), store)
    print(f"athanor dashboard: {store.url} on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
