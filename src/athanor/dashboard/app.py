"""The dashboard's web app (FastAPI, served by uvicorn like the OpenAI server).

Read-only by construction: the store is opened read-only (the database refuses writes), only GET and HEAD are
routed (anything else answers 405), and the pages carry no form. Every store text is adversarial (candidate
sources and descriptions come from agents, reasons from candidates' errors): Jinja's autoescape escapes it, the
charts escape their labels, and the content security policy allows no inline script and nothing from another
origin, so a planted `<script>` shows as text and would not run even if it slipped through.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from athanor.dashboard import charts, views
from athanor.store import Store

REFRESH_MS = 2000
"""How often an open page refreshes its contents (a compile's verdicts come every several seconds)."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
STATIC_TYPES = {"live.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


@dataclass(frozen=True)
class DashboardOptions:
    store: str
    """The store to show (a run directory, a store file or a PostgreSQL URL), opened read-only."""
    server: str = ""
    """An athanor server's base URL, to show what it serves now (its public /health and /metrics); empty: none."""


def _clock(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _duration(s: float | None) -> str:
    if s is None or s != s:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m // 60}h {m % 60:02d}m" if m >= 60 else f"{m}m {sec:02d}s"


def _number(v: Any) -> str:
    if not isinstance(v, (int, float)) or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"


def _interval(s: Any) -> str:
    """A speedup dict (median, ci_low, ci_high) as 'x1.190 [1.140, 1.236]'."""
    if not s or s.get("median") is None:
        return "-"
    return f"x{s['median']:.3f} [{s['ci_low']:.3f}, {s['ci_high']:.3f}]"


def _speedup(record: Any) -> str:
    """A record's speedup and interval (an evaluation or a leaderboard entry)."""
    median = getattr(record, "speedup", float("nan"))
    if median != median:
        return "-"
    return f"x{median:.3f} [{record.speedup_ci_low:.3f}, {record.speedup_ci_high:.3f}]"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("athanor.dashboard", "templates"),
                      autoescape=select_autoescape(("html",), default=True))
    env.filters.update(clock=_clock, duration=_duration, number=_number, interval=_interval, speedup=_speedup)
    return env


def server_status(url: str) -> dict[str, Any]:
    """What an athanor server says of itself on its public routes: the candidate it serves, requests in flight and
    its recent output tokens/s; or the error that kept it from answering."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        health = httpx.get(f"{url}/health", timeout=3).json()
        metrics = httpx.get(f"{url}/metrics", timeout=3).text
    except (httpx.HTTPError, ValueError) as e:
        return {"url": url, "error": f"{type(e).__name__}: {e}"}
    rate = next((s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                 if s.name == "athanor_generation_tokens_per_second"), float("nan"))
    return {"url": url, "candidate": health.get("candidate", ""), "in_flight": health.get("in_flight", 0),
            "tokens_per_s": rate}


def create_app(options: DashboardOptions, store: Store) -> FastAPI:
    """The dashboard over an open read-only `store`."""
    app = FastAPI(title="athanor dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    env = _environment()

    @app.middleware("http")
    async def read_only(request: Request, call_next: Any) -> Response:
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("405: the dashboard is read-only (GET only)", status_code=405,
                                     headers={"Allow": "GET, HEAD"})
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    def page(request: Request, name: str, title: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.update(now=time.time(), store=store.url, refresh_ms=REFRESH_MS, page=name, title=title)
        if request.query_params.get("fragment"):  # what live.js swaps into <main>
            return HTMLResponse(env.get_template(name).render(context), status_code=status)
        return HTMLResponse(env.get_template("base.html").render(context), status_code=status)

    def missing(request: Request, what: str) -> HTMLResponse:
        return page(request, "missing.html", "not found", status=404, what=what)

    @app.get("/", response_class=HTMLResponse)
    def runs(request: Request) -> HTMLResponse:
        return page(request, "runs.html", "runs", runs=views.runs_overview(store))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run(request: Request, run_id: str) -> HTMLResponse:
        view = views.run_view(store, run_id)
        if view is None:
            return missing(request, f"No run {run_id} in this store.")
        return page(request, "run.html", f"run {run_id}", view=view,
                    speedup_svg=charts.svg(charts.speedup_chart(view)), agents_svg=charts.svg(charts.agents_chart(view)))

    @app.get("/runs/{run_id}/candidates/{candidate_id}", response_class=HTMLResponse)
    def candidate(request: Request, run_id: str, candidate_id: str) -> HTMLResponse:
        view = views.candidate_view(store, run_id, candidate_id)
        if view is None:
            return missing(request, f"No candidate {candidate_id} in run {run_id}.")
        return page(request, "candidate.html", f"candidate {candidate_id}", view=view,
                    roofline_svg=charts.svg(charts.roofline_chart(view)))

    @app.get("/deployments", response_class=HTMLResponse)
    def deployments(request: Request) -> HTMLResponse:
        server = server_status(options.server) if options.server else None
        return page(request, "deployments.html", "deployments", deployments=views.deployments_view(store),
                    server=server)

    @app.get("/traffic", response_class=HTMLResponse)
    def traffic(request: Request) -> HTMLResponse:
        view = views.traffic_view(store)
        return page(request, "traffic.html", "traffic", view=view,
                    input_svg=charts.svg(charts.length_chart(view, "input")),
                    output_svg=charts.svg(charts.length_chart(view, "output")),
                    drift_svg=charts.svg(charts.drift_chart(view)) if len(view.timeline) > 1 else "")

    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC_TYPES:  # a fixed set: no path from the request reaches the file system
            return PlainTextResponse("404: no such file", status_code=404)
        body = resources.files("athanor.dashboard").joinpath("static", name).read_bytes()
        return Response(body, media_type=STATIC_TYPES[name])

    return app


def write_pngs(store: Store, directory: str) -> list[str]:
    """Every figure of the dashboard as a PNG file in `directory`: per run its speedups and agents, per verdicted
    candidate its roofline shares, and the traffic's length histograms and drift; the paths written."""
    from pathlib import Path

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []

    def put(chart: charts.Chart | None, name: str) -> None:
        if chart is not None and (chart.values if isinstance(chart, charts.Bars) else chart.x):
            written.append(str(charts.write_png(chart, out / f"{name}.png")))

    for summary in views.runs_overview(store):
        view = views.run_view(store, summary.run.id)
        if view is None:
            continue
        put(charts.speedup_chart(view), f"run-{summary.run.id}-speedup")
        put(charts.agents_chart(view), f"run-{summary.run.id}-agents")
        for cid in sorted({ev.candidate_id for ev in view.verdicts}):
            cv = views.candidate_view(store, summary.run.id, cid)
            if cv is not None:
                put(charts.roofline_chart(cv), f"run-{summary.run.id}-candidate-{cid}-roofline")
    traffic = views.traffic_view(store)
    put(charts.length_chart(traffic, "input"), "traffic-input")
    put(charts.length_chart(traffic, "output"), "traffic-output")
    if len(traffic.timeline) > 1:
        put(charts.drift_chart(traffic), "traffic-drift")
    return written
