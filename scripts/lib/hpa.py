"""What KEDA and the Kubernetes HPA controller decide, given a ScaledObject and its metrics.

Pure arithmetic, no processes: `autoscale.py` feeds it the values of the ScaledObject's
queries every polling interval and applies its answer to a local pool. It follows the
controllers' documented algorithms:

- KEDA activation: the pool is active while any trigger's value is above its
  `activationThreshold`; a pool at 0 replicas that becomes active goes to 1 (or
  `minReplicaCount` if larger); a pool that has been inactive for `cooldownPeriod` goes back
  to `minReplicaCount` (0 for scale to zero). Between those, the HPA decides, with
  `minReplicas = max(1, minReplicaCount)`.
- HPA, per `AverageValue` metric: `desired = ceil(value / target)` (the same as
  `ceil(current * (value / current) / target)`), unchanged while the usage ratio is within
  the 10 % tolerance; the largest proposal over the metrics wins.
- Stabilization (`behavior.scaleUp/scaleDown.stabilizationWindowSeconds`): a scale-up goes
  no higher than the smallest proposal of the up window, a scale-down no lower than the
  largest of the down window.
- Rate policies (`Percent`/`Pods` per `periodSeconds`, `selectPolicy` Max by default): the
  change within a period is limited relative to the replicas at the period's start.

All durations can be divided by `speed`, so that a local run watches in seconds what a
cluster does in minutes.
"""
import math

TOLERANCE = 0.1
# The HPA's defaults where a ScaledObject gives no behavior (Kubernetes documentation).
DEFAULT_UP = {"stabilizationWindowSeconds": 0,
              "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15},
                           {"type": "Pods", "value": 4, "periodSeconds": 15}]}
DEFAULT_DOWN = {"stabilizationWindowSeconds": 300,
                "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]}


class Trigger:
    def __init__(self, name, query, target, activation):
        self.name, self.query, self.target, self.activation = name, query, target, activation


class Spec:
    """The parts of a KEDA ScaledObject the controllers act on (times in seconds, / speed)."""

    def __init__(self, doc, speed=1.0, min_replicas=None, max_replicas=None):
        spec = doc.get("spec", {})
        self.min = int(spec.get("minReplicaCount", 0) if min_replicas is None else min_replicas)
        self.max = int(spec.get("maxReplicaCount", 100) if max_replicas is None else max_replicas)
        if self.min < 0 or self.max < max(self.min, 1):
            raise ValueError(f"replicas {self.min}:{self.max}: need 0 <= MIN <= MAX and MAX >= 1")
        self.polling = float(spec.get("pollingInterval", 30)) / speed
        self.cooldown = float(spec.get("cooldownPeriod", 300)) / speed
        behavior = (spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
                    .get("behavior", {}))
        self.up = _rules(behavior.get("scaleUp", DEFAULT_UP), speed)
        self.down = _rules(behavior.get("scaleDown", DEFAULT_DOWN), speed)
        self.triggers = []
        for t in spec.get("triggers", []):
            if t.get("type") != "prometheus":
                raise ValueError(f"trigger {t.get('name')!r}: only prometheus triggers run here")
            if t.get("metricType", "AverageValue") != "AverageValue":
                raise ValueError(f"trigger {t.get('name')!r}: only AverageValue is supported")
            m = t.get("metadata", {})
            self.triggers.append(Trigger(t.get("name", m["query"]), m["query"],
                                         float(m["threshold"]),
                                         float(m.get("activationThreshold", 0))))
        if not self.triggers:
            raise ValueError("the ScaledObject has no triggers")


def _rules(rules, speed):
    return {"window": float(rules.get("stabilizationWindowSeconds", 0)) / speed,
            "select": rules.get("selectPolicy", "Max"),
            "policies": [(p["type"], float(p["value"]), float(p["periodSeconds"]) / speed)
                         for p in rules.get("policies", [])]}


class Controller:
    """KEDA + HPA state for one scale target: call `decide` every polling interval."""

    def __init__(self, spec, now=0.0):
        self.spec = spec
        self.last_active = now
        self.proposals = []  # (time, proposal before stabilization)
        self.changes = []    # (time, replicas after minus before)

    def decide(self, now, current, values):
        """The replicas to run now, and why. `values`: trigger name -> value (None: the
        query failed; the HPA then keeps the current count, KEDA does not change activity).
        KEDA's own moves (0 -> 1, to 0 after the cooldown) are not HPA scale events, so
        they do not count against the rate policies."""
        s = self.spec
        known = {k: v for k, v in values.items() if v is not None}
        active = any(known.get(t.name, 0.0) > t.activation for t in s.triggers)
        if active:
            self.last_active = now
        if current == 0:
            if active:
                return max(s.min, 1), "activated: a trigger is above its activationThreshold"
            return current, "idle at 0"
        if not active and s.min == 0 and now - self.last_active >= s.cooldown:
            self.proposals.clear()
            return 0, f"inactive for cooldownPeriod {s.cooldown:g}s"
        if len(known) < len(s.triggers):
            return current, "a query failed: keeping the current count"
        proposals = []
        for t in s.triggers:
            v = known[t.name]
            if abs(v / current / t.target - 1.0) <= TOLERANCE:
                proposals.append((current, f"{t.name} {v:g} within tolerance of "
                                  f"{t.target:g} x {current}"))
            else:
                proposals.append((math.ceil(v / t.target - 1e-9),
                                  f"{t.name} {v:g} / target {t.target:g}"))
        proposal, reason = max(proposals, key=lambda p: p[0])
        self.proposals.append((now, proposal))
        stable = self._stabilize(now, current, proposal)
        limited = self._limit(now, current, stable)
        desired = min(max(limited, max(1, s.min)), s.max)
        if desired != proposal:
            reason += f" = {proposal}, stabilized and limited to {desired}"
        if desired != current:
            self.changes.append((now, desired - current))
            keep = max([p for _, _, p in s.up["policies"] + s.down["policies"]], default=0.0)
            self.changes = [(t, d) for t, d in self.changes if t > now - keep]
        return desired, reason

    def _stabilize(self, now, current, proposal):
        up, down = proposal, proposal
        for t, p in self.proposals:
            if t > now - self.spec.up["window"]:
                up = min(up, p)
            if t > now - self.spec.down["window"]:
                down = max(down, p)
        horizon = max(self.spec.up["window"], self.spec.down["window"])
        self.proposals = [(t, p) for t, p in self.proposals if t > now - horizon]
        rec = current
        if rec < up:
            rec = up
        if rec > down:
            rec = down
        return rec

    def _limit(self, now, current, desired):
        if desired > current:
            rules, grow = self.spec.up, True
        elif desired < current:
            rules, grow = self.spec.down, False
        else:
            return desired
        limits = []
        for kind, value, period in rules["policies"]:
            changed = sum(d for t, d in self.changes if t > now - period
                          and (d > 0) == grow)
            start = current - changed
            if grow:
                limits.append(math.ceil(start * (1 + value / 100)) if kind == "Percent"
                              else start + value)
            else:
                limits.append(math.floor(start * (1 - value / 100)) if kind == "Percent"
                              else start - value)
        if not limits:
            return desired
        if rules["select"] == "Disabled":
            return current
        pick = max if (rules["select"] == "Max") == grow else min
        bound = pick(limits)
        return min(desired, bound) if grow else max(desired, bound)
