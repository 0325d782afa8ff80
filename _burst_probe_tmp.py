import time, sys
from bench import console as c
from bench.common import scratch, PAYLOAD
from nereus.service.arguments import schedule_record

burst = int(sys.argv[1])
with scratch("probe-") as root:
    n = c.build(root, 10_000)
    try:
        t0 = int(time.time()*1000) + 3000
        for s in range(0, burst, 1000):
            c._execute(n, [schedule_record("burst", f"b{i}", PAYLOAD, deliver_at_ms=t0) for i in range(s, min(burst, s+1000))], "scheduled")
        c._until("burst", c._at_least(lambda: c._shard(n).delivered, burst))
        insp = n.service.inspection()
        print("log", c._shard(n).log_position)
        for q in ("q1", "burst", None):
            ts=[]
            for _ in range(5):
                t=time.perf_counter(); r = insp.recent_deliveries("default", q, 20); ts.append(time.perf_counter()-t)
            print(q, len(r), "min %.1f ms" % (min(ts)*1000))
    finally:
        n.close()
