"""The application layer: between the runtime and the edges.

It checks a caller's arguments and builds the kernel's records from them (`arguments`),
shapes the kernel's verdicts into answers (`results`) with the one list of codes every edge
answers with (`codes`), and says whether a process is ready (`readiness`, `clock_bound`).
Its one port, `port.TimerService`, is what every edge needs from a running service; the
user-facing calls are made once over it (`calls.TimerCalls`), and `embedded.EmbeddedService`
implements it over one shard in this process (Kafka mode's is `adapters.kafka.service`).
The edges (HTTP, the CLI, the library facades, the console) use it; they do not use each
other. `specs/service.md` says more.
"""
