#!/usr/bin/env python3
"""A short slice of `scripts/bench soak` (scripts/lib/bench/soak.py) as a test: 40 s of
streamed load through a real Envoy with flow control, tenants changing, clients hanging
up after the first token, a pool small enough that requests wait, and one server killed
and restarted on its port half way. It asserts what a user relies on over a long run:
Envoy saw exactly the requests the client sent (nothing lost, nothing answered twice),
every answer is 200, 429 or 503, no request is stranded in the gateway's queue or left
counted as running (cancelled ones included) once the load stops, and the restarted
server is used again. Envoy's memory slope is the benchmark's to measure, not a test's.

  .venv/bin/python scripts/lib/test_soak.py     (needs the release builds and loadgen)
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))
import common  # noqa: E402
import soak  # noqa: E402


class Soak(unittest.TestCase):
    def test_a_short_soak_accounts_for_every_request(self):
        o = soak.options(["--seconds", "40", "--qps", "40", "--tenant-churn", "50",
                          "--cancel", "0.1", "--sample-every", "2"])
        r = common.run_with_procs(lambda procs: soak.soak(o, procs))
        print(f"\n  {r['sent']} sent: {r['status']}, cancelled {r['cancelled']}, queue peak "
              f"{r['queue_peak']:g}, restarted server served {r['served_by_restarted']}",
              file=sys.stderr)
        self.assertGreater(r["sent"], 1000)
        self.assertEqual(r["envoy_downstream_total"], r["sent"], "Envoy's count of "
                         "requests differs from the client's")
        self.assertEqual(sum(r["status"].values()), r["sent"], "a request got no answer")
        self.assertLessEqual(set(r["status"]), {"200", "429", "503"}, r["status"])
        self.assertGreater(r["cancelled"], 0)
        self.assertEqual(r["timeouts"], 0)
        self.assertEqual(r["queue_after"], 0, "requests stranded in the gateway's queue")
        self.assertEqual(r["running_after"], 0, "requests still counted as running")
        self.assertGreater(r["served_by_restarted"], 0, "the restarted server was not used")


if __name__ == "__main__":
    unittest.main(verbosity=2)
