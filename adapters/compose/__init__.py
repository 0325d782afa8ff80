"""The composition root: the one package that joins the edges into a running service.

Theory of operation: each edge package (`adapters.http`, `adapters.cli`, `adapters.kafka`,
`adapters.pulsar`, `adapters.local`) talks to the layers below and the shared adapter
modules, never to another edge (`specs/layers.md`, kept by `tests/project/test_layers.py`). Whatever
needs two of them is built here: `nereus serve` parses its options (`adapters.cli.serve`)
and calls `serve.serve`, which reads the configuration (`config`: the tenancy and the edges'
own sections), builds the destination (`destinations`: local, Pulsar, or both; Kafka mode's
topics), the HTTP API over the embedded runtime or `KafkaService` (`http`, the one place
that constructs it), and the `--processes` supervisor and its siblings (`processes`,
`lifeline`). Commands that act on stored files directly reach another edge's files only
through here too (`stores`: the local destination for `nereus tail`; `replay`: the Kafka
source given to `nereus replay --kafka`).
"""
