"""The application layer: between the runtime and the edges.

It checks a caller's arguments and builds the kernel's records from them (`arguments`),
shapes the kernel's verdicts into answers (`results`) with the one list of codes every edge
answers with (`codes`), and says whether a process is ready (`readiness`, `clock_bound`).
The edges (HTTP, the CLI, the library facades, the console) use it; they do not use each
other.
"""
