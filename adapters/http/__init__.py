"""The HTTP timer API (`specs/http.md`), served as an ASGI application on uvicorn.

One job per module, read from the socket up:

    server.py    HttpServer: uvicorn in a thread of its own, on a socket bound here
    protocol.py  the connection: h11, limits and timeouts, JSON answers to protocol errors
    phases.py    the connection's phases: its one timer, flow control, refusals
    head.py      the checks on a request head (sizes, version, Content-Length), pure
    asgi.py      the ASGI application: a request in, the API's response out
    api.py       TimerApi: route, authenticate, authorize, then the route's handler
    routing.py   the route table (`contract.ROUTES`) matched once; strict path and query
    policy.py    rate limit, blocks and quotas: whether a batch may produce
    batch.py     a POST batch parsed and checked whole
    shapes.py    the JSON shapes of results, peeks and list rows
    writes.py    the appending routes (POST a batch, DELETE) over the service port
    errors.py    ApiError and the error response
    contract.py  the closed lists: routes, error codes, statuses, limits
    openapi.py   the OpenAPI document built from the contract
    auth.py      bearer tokens
    process.py   process_* metrics and nereus_build_info

Nothing is re-exported here: `adapters.tenancy` imports the contract, and the API imports
the tenancy, so a package that imported its modules on import would import itself.
"""
