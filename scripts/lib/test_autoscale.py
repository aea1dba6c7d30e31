#!/usr/bin/env python3
"""The local autoscaler: hpa.py's arithmetic against worked examples of the KEDA and HPA
rules, and the whole loop through `scripts/run --autoscale 0:3` (Envoy 1.40 with the filter,
Debian's Prometheus running the ScaledObject's queries, vllm-sim servers with a cold start,
discovery through a watched EDS file).

  .venv/bin/python scripts/lib/test_autoscale.py [-k PATTERN]

Needs the release builds (scripts/run builds them) and scripts/setup --autoscale.
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import autoscale  # noqa: E402
import autoscale_scenario  # noqa: E402
import hpa  # noqa: E402


def scaled_object(min_r=0, max_r=8, up_window=0, down_window=300, policies=None,
                  cooldown=300):
    policies = policies or [{"type": "Percent", "value": 100, "periodSeconds": 15}]
    return {"spec": {
        "minReplicaCount": min_r, "maxReplicaCount": max_r, "pollingInterval": 15,
        "cooldownPeriod": cooldown,
        "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
            "scaleUp": {"stabilizationWindowSeconds": up_window, "policies": policies},
            "scaleDown": {"stabilizationWindowSeconds": down_window, "policies": policies}}}},
        "triggers": [
            {"type": "prometheus", "name": "queue", "metricType": "AverageValue",
             "metadata": {"query": "q", "threshold": "1", "activationThreshold": "0"}},
            {"type": "prometheus", "name": "running", "metricType": "AverageValue",
             "metadata": {"query": "r", "threshold": "16"}}]}}


class Arithmetic(unittest.TestCase):
    def ctl(self, **kw):
        return hpa.Controller(hpa.Spec(scaled_object(**kw)), now=0.0)

    def test_a_waiting_request_wakes_a_pool_at_zero_and_nothing_else_does(self):
        c = self.ctl()
        self.assertEqual(c.decide(15, 0, {"queue": 0, "running": 0})[0], 0)
        self.assertEqual(c.decide(30, 0, {"queue": 1, "running": 0})[0], 1)

    def test_the_larger_of_the_two_metrics_wins(self):
        c = self.ctl(policies=[{"type": "Pods", "value": 100, "periodSeconds": 15}])
        # running 40 / 16 -> 3; queue 2 / 1 -> 2
        self.assertEqual(c.decide(15, 1, {"queue": 2, "running": 40})[0], 3)
        c = self.ctl(policies=[{"type": "Pods", "value": 100, "periodSeconds": 15}])
        # queue 5 / 1 -> 5; running 40 / 16 -> 3
        self.assertEqual(c.decide(15, 1, {"queue": 5, "running": 40})[0], 5)

    def test_within_the_tolerance_nothing_changes(self):
        c = self.ctl()
        # running 33 on 2 replicas: 16.5 each, 3 % over the target of 16.
        self.assertEqual(c.decide(15, 2, {"queue": 0, "running": 33})[0], 2)

    def test_percent_policy_at_most_doubles_per_period(self):
        c = self.ctl()
        self.assertEqual(c.decide(15, 1, {"queue": 0, "running": 100})[0], 2)
        # Within the same 15 s period: 2 already added to a period start of 1.
        self.assertEqual(c.decide(20, 2, {"queue": 0, "running": 100})[0], 2)
        self.assertEqual(c.decide(31, 2, {"queue": 0, "running": 100})[0], 4)

    def test_the_scale_down_window_holds_the_highest_recent_proposal(self):
        c = self.ctl(down_window=300)
        self.assertEqual(c.decide(15, 1, {"queue": 0, "running": 40})[0], 2)
        self.assertEqual(c.decide(30, 2, {"queue": 0, "running": 40})[0], 3)
        # The load halves: 3 is still within the window, so no scale-down yet.
        self.assertEqual(c.decide(45, 3, {"queue": 0, "running": 17})[0], 3)
        # 301 s after the last proposal of 3, the window has only 2s.
        for t in range(60, 346, 15):
            c.decide(t, 3, {"queue": 0, "running": 17})
        self.assertEqual(c.decide(346, 3, {"queue": 0, "running": 17})[0], 2)

    def test_the_scale_up_window_waits_for_a_sustained_rise(self):
        c = self.ctl(up_window=60)
        self.assertEqual(c.decide(15, 1, {"queue": 0, "running": 10})[0], 1)
        # A spike: the window still holds the proposal of 1.
        self.assertEqual(c.decide(30, 1, {"queue": 0, "running": 40})[0], 1)
        for t in (45, 60, 75):
            c.decide(t, 1, {"queue": 0, "running": 40})
        self.assertEqual(c.decide(90, 1, {"queue": 0, "running": 40})[0], 2)

    def test_scale_to_zero_only_after_the_cooldown(self):
        c = self.ctl(cooldown=300)
        c.decide(15, 0, {"queue": 3, "running": 0})
        self.assertEqual(c.decide(30, 1, {"queue": 0, "running": 0})[0], 1)
        self.assertEqual(c.decide(300, 1, {"queue": 0, "running": 0})[0], 1)
        self.assertEqual(c.decide(316, 1, {"queue": 0, "running": 0})[0], 0)
        # With minReplicaCount 1 it never goes below 1.
        c = self.ctl(min_r=1)
        self.assertEqual(c.decide(999, 1, {"queue": 0, "running": 0})[0], 1)

    def test_a_failed_query_keeps_the_count(self):
        c = self.ctl()
        self.assertEqual(c.decide(15, 2, {"queue": None, "running": 100})[0], 2)

    def test_max_bounds_everything(self):
        c = self.ctl(max_r=3, policies=[{"type": "Pods", "value": 100, "periodSeconds": 15}])
        self.assertEqual(c.decide(15, 1, {"queue": 50, "running": 0})[0], 3)

    def test_times_divide_by_the_speed(self):
        s = hpa.Spec(scaled_object(), speed=10)
        self.assertEqual((s.polling, s.cooldown, s.down["window"]), (1.5, 30.0, 30.0))

    def test_the_shipped_scaled_object_loads_with_local_names(self):
        import yaml
        with open(autoscale.SCALED_OBJECT) as f:
            spec = hpa.Spec(yaml.safe_load(f))
        autoscale.local_queries(spec, "default-pool", "sim-model")
        queries = {t.name: t.query for t in spec.triggers}
        self.assertIn('inference_pool="default-pool"', queries["queue"])
        self.assertIn('target_model_name="sim-model"', queries["running"])
        self.assertEqual((spec.min, spec.max, spec.polling), (0, 8, 15.0))


class ScaleFromZero(unittest.TestCase):
    """The whole loop (about 2 minutes)."""

    def test_scale_from_zero_out_and_back_to_zero(self):
        with tempfile.TemporaryDirectory() as d:
            r = autoscale_scenario.scenario(d, speed=20.0, replicas="0:3", burst=8,
                                            clients=20, sustain_s=40.0)
        print(f"\n  first token after zero {r['ttft_after_zero_s']:.2f}s (again "
              f"{r['ttft_after_zero_again_s'] or 0:.2f}s), replicas under load "
              f"{r['replicas_under_load']} (max {r['max_replicas']}), back to 0 "
              f"{r['back_to_min_after_s']}s after the load", file=sys.stderr)
        self.assertEqual(r["idle_replicas"], 0, r)
        self.assertEqual(r["burst_status"], [200] * 8, "a request failed while the pool "
                         "was at zero")
        self.assertEqual(r["sustained"]["failed"], 0, r["sustained"])
        # 20 running at 16 per replica: ceil(20 / 16) = 2, once the windows have passed.
        self.assertEqual(r["replicas_under_load"], r["expected_under_load"], r["decisions"])
        self.assertTrue(r["back_to_min"], r["decisions"][-5:])
        self.assertEqual(r["after_zero_status"], 200)
        self.assertIsNotNone(r["ttft_after_zero_again_s"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
