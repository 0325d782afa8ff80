"""The console's actions: log in and out, cancel, reschedule, unblock a tenant, audit.

Each action that changes a timer or a tenant is two steps: a GET of a confirmation page
that says what will happen, and the POST of its form, which carries the CSRF token and
needs the `admin` grant (`app`). A command goes through the same service call and the same
policy as the HTTP API's (a cancel takes the DELETE's rate-limit token, and is never refused
for a pending timer), and its answer is the kernel's verdict, shown as the API would give
it: status, code and message.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from nereus.adapters.http.batch import identity_problem
from nereus.adapters.http.console import render
from nereus.adapters.http.console.app import PREFIX, Ctx, route
from nereus.adapters.http.console.session import clear_cookie, set_cookie
from nereus.adapters.http.errors import ApiError, Response
from nereus.adapters.http.writes import commit_errors
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable
from nereus.service.arguments import cancel_record, reschedule_record
from nereus.service.codes import NAMES_JSON
from nereus.service.results import Result, to_result

if TYPE_CHECKING:
    from nereus.adapters.http.console.app import Console

ACTIONS: Final = ("cancel", "reschedule", "unblock")


@route("POST", "/console/login", "public")
async def login(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    if c.disabled:
        return render.redirect(f"{PREFIX}/overview")
    token = ctx.form.get("token", "").strip()
    who = c.api.auth.principal_of(c.api.auth.digest_of(token)) if token else None
    if who is None:
        page = c.context(ctx, "Log in", error="Unknown token.")
        return render.page("login.html", page, status=401)
    _session, value = c.sessions.issue(c.api.auth.digest_of(token).hex())
    c.api.log.info("console_login", tenant=who.tenant, subject=who.subject)
    cookie = set_cookie(value, secure=False)
    return render.redirect(f"{PREFIX}/overview", (("Set-Cookie", cookie),))


@route("POST", "/console/logout", "read")
async def logout(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    return render.redirect(f"{PREFIX}/login", (("Set-Cookie", clear_cookie()),))


@route("GET", "/console/confirm", "admin")
async def confirm(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    action = ctx.query.get("action", "")
    if action not in ACTIONS:
        return c.refusal(f"unknown action {action!r}", 400, ctx)
    values = {k: ctx.query.get(k, "") for k in ("queue", "key", "delay_ms")}
    return render.page("confirm.html", c.context(ctx, "Confirm", action=action, values=values))


@route("POST", "/console/actions/cancel", "admin")
async def cancel(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    queue, key = ctx.form.get("queue", ""), ctx.form.get("key", "")
    problem = identity_problem(ctx.who.tenant, queue, key, c.api.kernel)
    if problem is not None:
        return c.refusal(problem, 400, ctx)
    item = cancel_record(queue, key, tenant=ctx.who.tenant)

    async def commit() -> list[EntryOutcome] | None:
        return await c.api.service.cancel_async(
            [item], lambda: c.api.policy.take_delete(ctx.who), c.api.commit_timeout_s
        )

    return await _command(c, ctx, "Cancel", item, commit)


@route("POST", "/console/actions/reschedule", "admin")
async def reschedule(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    queue, key = ctx.form.get("queue", ""), ctx.form.get("key", "")
    problem = identity_problem(ctx.who.tenant, queue, key, c.api.kernel)
    if problem is not None:
        return c.refusal(problem, 400, ctx)
    try:
        delay_ms = int(ctx.form.get("delay_ms", "").strip(), 10)
        item = reschedule_record(queue, key, delay_ms=delay_ms, tenant=ctx.who.tenant)
    except (TypeError, ValueError) as exc:
        return c.refusal(f"invalid_timing: {exc}", 400, ctx)

    async def commit() -> list[EntryOutcome] | None:
        return await c.api.service.execute_async([item], c.api.commit_timeout_s)

    return await _command(c, ctx, "Reschedule", item, commit)


async def _command(
    c: Console,
    ctx: Ctx,
    what: str,
    item: Appendable,
    commit: Callable[[], Awaitable[list[EntryOutcome] | None]],
) -> Response:
    """Commit one command and show its verdict (None from `commit`: rate limited)."""
    try:
        with commit_errors():
            outcomes = await commit()
    except ApiError as exc:
        return c.refusal(f"{exc.code}: {exc}", exc.status, ctx)
    if outcomes is None:
        return c.refusal("rate_limited: this credential's cancels are over its rate", 429, ctx)
    result = to_result(outcomes[0], item[0], c.api.kernel, NAMES_JSON)
    _log(c, ctx, what.lower(), result)
    return _verdict(c, ctx, what, result)


@route("POST", "/console/actions/unblock", "admin")
async def unblock(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    c.api.blocks.set(ctx.who.tenant, False)
    c.api.log.info("tenant_block", tenant=ctx.who.tenant, blocked=False, by=ctx.who.subject)
    return render.redirect(f"{PREFIX}/obligations")


@route("GET", "/console/audit", "admin")
async def audit_page(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    # Every shard of the service, whichever process holds it: its audit runs there.
    insp = c.inspection
    shards = await c.api._read(insp.shards) if insp is not None else []
    jobs = await c.api._read(c.audits.jobs)
    running = any(j.state == "running" for j in jobs.values())
    return render.page(
        "audit.html",
        c.context(
            ctx,
            "Audit",
            jobs=jobs,
            shards=sorted({h.shard for h in shards}),
            running=running,
            answered_by=os.getpid(),
        ),
        headers=(("Refresh", "2"),) if running else (),
    )


@route("POST", "/console/audit", "admin")
async def audit_start(c: Console, ctx: Ctx, _: dict[str, str]) -> Response:
    try:
        shard = int(ctx.form.get("shard", ""), 10)
    except ValueError:
        return c.refusal("shard must be a number", 400, ctx)
    job = await c.api._read(c.audits.start, shard, ctx.who.subject or ctx.who.tenant)
    if job is None:
        return c.refusal(f"shard {shard} is held by no process of this service now", 404, ctx)
    c.api.log.info("console_audit", shard=shard, by=ctx.who.subject)
    return render.redirect(f"{PREFIX}/audit")


def _verdict(c: Console, ctx: Ctx, what: str, result: Result) -> Response:
    return render.page(
        "verdict.html", c.context(ctx, f"{what}: {result.status}", what=what, result=result)
    )


def _log(c: Console, ctx: Ctx, action: str, result: Result) -> None:
    c.api.log.info(
        "console_action",
        action=action,
        tenant=ctx.who.tenant,
        by=ctx.who.subject,
        queue=result.queue,
        timer_key=result.timer_key,
        status=result.status,
        code=result.code,
    )
