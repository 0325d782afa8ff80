"""Kafka as the destination and as the shard log. Everything here needs the `kafka` extra
(confluent-kafka).

    destination.py  KafkaDestination: publishing attempts (outcomes.py reads delivery reports,
                    txn.py is the transactional capability, evidence.py searches in bulk)
    log.py          KafkaLog: one partition of the commands topic as a shard's log (the
                    reading and folding side: log_open.py where it resumes, log_read.py
                    records into entries, log_snapshots.py its snapshots; log_writer.py
                    its transactions and fencing)
    service.py      KafkaService, the front of Kafka mode, over its parts: config.py,
                    topics.py (topic admin), ownership.py (group membership, shard
                    lifecycle), rpc.py (commands and replies), reads.py
    library.py      KafkaNereus, the library calls over the commands topic
    siblings.py     reads and /metrics across the processes of one `serve --processes`
                    (exposition.py merges their metrics texts; neither needs the extra)
    wire.py         the envelopes and replies on the topics
"""
