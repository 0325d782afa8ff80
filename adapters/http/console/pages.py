"""The console's pages that only read: overview, queues, a queue's timers, one timer's story,
obligations, and the small public routes (login form, stylesheet, zone choice).

Every read goes through the API's reader (`TimerApi._read`: inline for the embedded store,
on a thread where a read may wait on a shard's lock), and every list is one page: a page
costs what it shows.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Final

from nereus.adapters.http.batch import identity_problem
from nereus.adapters.http.console import render
from nereus.adapters.http.console.app import PREFIX, Ctx, route
from nereus.adapters.http.console.lag import chart
from nereus.adapters.http.errors import ApiError, Response
from nereus.kernel.keys import message_id
from nereus.service.inspect import Inspection

if TYPE_CHECKING:
    from nereus.adapters.http.console.app import Console

QUEUES_PAGE: Final = 100
TIMERS_PAGE: Final = 50
RECENT: Final = 20
OBLIGATIONS_PAGE: Final = 200
_MISSING: Final = "This page needs the service's inspection, which this mode does not offer yet."


@route("GET", "/console", "read")
async def home(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    return render.redirect(f"{PREFIX}/overview")


@route("GET", "/console/static/{name}", "public")
async def static_file(c: Console, ctx: Ctx, params: dict[str, str]) -> Response:
    found = render.static(params["name"])
    if found is None:
        return render.page("error.html", render.bare("Not found", "no such file"), status=404)
    return found


@route("GET", "/console/zone", "public")
async def choose_zone(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    """Remember the viewer's zone (a preference, not a credential: no CSRF needed)."""
    back = ctx.query.get("back", f"{PREFIX}/overview")
    if not back.startswith(f"{PREFIX}/") or "//" in back or "\\" in back:
        back = f"{PREFIX}/overview"
    name = ctx.query.get("tz", "")
    zone = render.zone_of(name)
    value = str(zone) if zone is not None else ""
    cookie = f"{render.ZONE_COOKIE}={value}; Path=/console; Max-Age=31536000; SameSite=Strict"
    return render.redirect(back, (("Set-Cookie", cookie),))


@route("GET", "/console/login", "public")
async def login_form(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    return render.page("login.html", c.context(ctx, "Log in", error=None))


@route("GET", "/console/overview", "read")
async def overview(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    insp = ctx.inspection
    shards = (
        await c.api._read(insp.shards) if insp is not None and "admin" in ctx.who.grants else []
    )
    usage = await c.api._read(c.api.service.tenant_usage, ctx.who.tenant)
    metrics = c.api.service.metrics
    lag = await c.api._read(c.lag_view)
    return render.page(
        "overview.html",
        c.context(
            ctx,
            "Overview",
            shards=shards,
            usage=usage,
            early=int(metrics.total("nereus_early_deliveries_total")),
            chart=chart(lag.windows),
            windows=lag.windows[-6:],
            published=sum(w.published for w in lag.windows),
            lag_covered=lag.covered,
            lag_processes=lag.processes,
            blocked=c.api.policy.blocked(ctx.who.tenant),
        ),
    )


@route("GET", "/console/queues", "read")
async def queues(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    insp = ctx.inspection
    if insp is None:
        return c.refusal(_MISSING, 501, ctx)
    rows, more = await c.api._read(insp.queues, ctx.who.tenant, QUEUES_PAGE)
    recent = await c.api._read(insp.recent_deliveries, ctx.who.tenant, None, RECENT)
    dead = await c.api._read(insp.dead_letters, ctx.who.tenant, None, RECENT)
    dead_by_queue = Counter(d.queue for d in dead)
    return render.page(
        "queues.html",
        c.context(
            ctx,
            "Queues",
            rows=rows,
            more=more,
            recent=recent,
            dead=dead,
            dead_by_queue=dead_by_queue,
        ),
    )


@route("GET", "/console/queues/{queue}", "read")
async def queue(c: Console, ctx: Ctx, params: dict[str, str]) -> Response:
    name = params["queue"]
    problem = identity_problem(ctx.who.tenant, name, "k", c.api.kernel)
    if problem is not None:
        return c.refusal(problem, 400, ctx)
    after = ctx.query.get("after") or None
    try:
        rows, more = await c.api._read(
            c.api.service.list_timers, name, after, TIMERS_PAGE, tenant=ctx.who.tenant
        )
    except ApiError as exc:
        return c.refusal(str(exc), exc.status, ctx)
    insp = ctx.inspection
    recent = (
        await c.api._read(insp.recent_deliveries, ctx.who.tenant, name, RECENT)
        if insp is not None
        else []
    )
    dead = (
        await c.api._read(insp.dead_letters, ctx.who.tenant, name, RECENT)
        if insp is not None
        else []
    )
    return render.page(
        "queue.html",
        c.context(
            ctx,
            f"Queue {name}",
            queue=name,
            rows=rows,
            more=more,
            next_after=rows[-1].timer_key if more and rows else None,
            recent=recent,
            dead=dead,
        ),
    )


@route("GET", "/console/timer", "read")
async def timer(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    insp = ctx.inspection
    q = ctx.query
    search = {k: q.get(k, "") for k in ("queue", "key", "message", "attempt", "txn")}
    context: dict[str, Any] = {"search": search, "story": None, "searched": False}
    if insp is None:
        return c.refusal(_MISSING, 501, ctx)
    mid = await _message_id(c, ctx, insp, search)
    if mid is not None:
        context["searched"] = True
        context["story"] = await c.api._read(insp.story, ctx.who.tenant, mid)
    elif any(search.values()):
        context["searched"] = True
    return render.page("timer.html", c.context(ctx, "Timer", **context))


async def _message_id(c: Console, ctx: Ctx, insp: Inspection, search: dict[str, str]) -> str | None:
    """The message a search names, within the viewer's tenant."""
    tenant = ctx.who.tenant
    if search["queue"] and search["key"]:
        if identity_problem(tenant, search["queue"], search["key"], c.api.kernel) is not None:
            return None
        return message_id(tenant, search["queue"], search["key"])
    if search["message"]:
        return search["message"].strip().lower()
    if search["attempt"]:
        return await c.api._read(insp.message_of_attempt, tenant, search["attempt"].strip())
    if search["txn"]:
        return await c.api._read(insp.message_of_txn, tenant, search["txn"])
    return None


@route("GET", "/console/obligations", "read")
async def obligations(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    insp = ctx.inspection
    if insp is None:
        return c.refusal(_MISSING, 501, ctx)
    rows, more = await c.api._read(insp.obligations, ctx.who.tenant, OBLIGATIONS_PAGE)
    return render.page(
        "obligations.html",
        c.context(
            ctx,
            "Obligations",
            rows=rows,
            more=more,
            blocked=c.api.policy.blocked(ctx.who.tenant),
            admin_blocked=c.api.blocks.get(ctx.who.tenant),
        ),
    )
