"""Render the generated files of `specs/`: the kernel's (`kernel.specdoc`), with the code list
of `specs/codes.md` followed by the answers every client surface gives (`service.codes`).

Theory of operation: the kernel cannot import the adapters, so the page that documents both
the log's verdicts and the client's answers is put together here; `scripts/specgen` writes
it and `tests/project/test_specs.py` fails when a committed file differs from this rendering.
"""

from __future__ import annotations

from nereus.kernel.specdoc import render_all as render_kernel
from nereus.service.codes import HTTP_ANSWERS, REFUSAL_ANSWERS, RESULT_ANSWERS, Answer

_INTRO = """
# Answers to clients (one list for the library, HTTP and the Kafka RPC)

Every answer a client gets carries one code of this list, and the same string on every
surface: `nereus.Nereus` and `nereus.KafkaNereus` (whose commands travel the Kafka RPC) give a
`Result`, the HTTP API a result element or, for a request refused whole, an error body. A
code's **HTTP** status is that of the answer that carries it: `200` for a result element
(the POST batch and DELETE answer 200 and each element says `ok`), else the error's status.
**retryable** says whether the same request, unchanged, may succeed later (after a backoff,
or once an operator, the tenant's own timers or the shard ownership change the state); one
that is not needs a different request. Where the HTTP edge checks a rule itself, it refuses
the whole batch with that rule's code before anything is appended (its status below), in the
kernel's order: identity, txn, payload, headers, timing, horizon; a rule only the kernel
checks comes back as a `rejected` element. One command is answered differently, on purpose:
a `nereus-*` header is `server_owned_field` over HTTP, where it is one of the fields the
server sets (with `producerSub`, `messageId`, `tenant`), and `invalid_headers` in the
library, whose caller is the server side (it may set `producer_sub`) and meets the kernel's
rule itself.

The shape is one: `{ok, status, code, queue, timerKey, txn, messageId, deliverAt, attemptId,
evidence, message}` over HTTP and the same fields in the library's `Result` (snake_case).
`status` is one of `scheduled`, `rescheduled`, `unchanged`, `canceled`, `too_late`, `absent`,
`rejected`; `code` is the status itself, or for `rejected` the rule's code; `message` is on
every answer that is not `ok`, the same words on every surface (HTTP prefixes a batch
refusal with the operation, `operations[2]: 1125000 bytes > ceiling 1048576`). An HTTP error
body is `{"error": {"code", "message"}}`. In the library `Result.raise_for_status()` returns
the result when it is `ok` and otherwise raises `nereus.NereusRefused` with `.code`,
`.message` and `.result`. A library argument of the wrong type or value is `TypeError` /
`ValueError` before anything is submitted, and a command that could not be answered raises
(`Overloaded`, `Unavailable`, `TimeoutError`: HTTP's `overloaded` and `unavailable`).

`horizon_exceeded` was `deliver_beyond_horizon` in the library before this list existed;
Python's `Code.DELIVER_BEYOND_HORIZON` is a deprecated alias of `Code.HORIZON_EXCEEDED`, and
a Kafka reply from a process of an earlier build that says `deliver_beyond_horizon` decodes
as `horizon_exceeded`. No log record holds a code (outcomes are recomputed by replay), so old
logs keep their meaning; the metric `nereus_entries_total{code=...}` counts the new name.
During a rolling upgrade a process of an earlier build cannot decode a reply saying
`horizon_exceeded`, and that one command times out (a retry with its txn is safe). The HTTP
API answered `invalid_identity`, `invalid_txn`, `invalid_headers` and `invalid_timing` as
`400 invalid_operation` before; `invalid_operation` is now only an operation the API does
not take at all (an unknown op or field, a value of the wrong type: the library's
`TypeError`).
"""


def _row(code: str, answer: Answer, http: str | None = None) -> str:
    retry = "yes" if answer.retryable else "no"
    return f"| `{code}` | {http or answer.http_status} | {retry} | {answer.meaning} |"


def answers_md() -> str:
    head = ["| code | HTTP | retryable | meaning |", "|---|---|---|---|"]
    lines = [_INTRO, "## Results of a command (every surface)\n", *head]
    lines += [_row(str(c), a) for c, a in RESULT_ANSWERS.items()]
    lines += ["", "## Refusals by the kernel's rules (every surface)\n", *head]
    for code, answer in REFUSAL_ANSWERS.items():
        http = None if answer.http_status >= 400 else "200, `rejected`"
        lines.append(_row(str(code), answer, http))
    lines += ["", "## Refusals of the HTTP edge (HTTP only)\n", *head]
    lines += [_row(c, a) for c, a in HTTP_ANSWERS.items()]
    return "\n".join(lines) + "\n"


def render_all() -> dict[str, str]:
    """File name under specs/ -> content."""
    files = render_kernel()
    files["codes.md"] = files["codes.md"] + answers_md()
    return files
