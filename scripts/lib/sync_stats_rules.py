#!/usr/bin/env python3
"""Copies envoy/stats-tags.yaml and envoy/histogram-buckets.yaml into the deployment
manifests that carry them (Istio's bootstrap-override ConfigMap and the gateway's
statsHistogramBuckets annotation; Envoy Gateway's EnvoyProxy bootstrap). Run it after
changing either file; scripts/lib/test_deploy.py fails while they disagree.

  scripts/lib/sync_stats_rules.py
"""
import json
import os
import re

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name):
    with open(os.path.join(ROOT, "envoy", name)) as f:
        return yaml.safe_load(f)


def rewrite(path, fn):
    path = os.path.join(ROOT, path)
    with open(path) as f:
        text = f.read()
    new = fn(text)
    if new != text:
        with open(path, "w") as f:
            f.write(new)
        print(f"updated {os.path.relpath(path, ROOT)}")


def main():
    tags = load("stats-tags.yaml")
    buckets = load("histogram-buckets.yaml")

    def istio_bootstrap(text):
        head, sep, old = text.partition("  custom_bootstrap.json: |\n")
        doc = json.loads(old) if old.strip() else {}  # keeps the rest (the overload manager)
        doc.setdefault("stats_config", {})["stats_tags"] = tags
        body = json.dumps(doc, indent=2)
        return head + sep + "".join("    " + line + "\n" for line in body.splitlines())

    def istio_gateway(text):
        value = json.dumps({b["match"]["prefix"]: b["buckets"] for b in buckets}, separators=(",", ":"))
        return re.sub(r"(sidecar\.istio\.io/statsHistogramBuckets: )'.*'", lambda m: m.group(1) + f"'{value}'", text)

    def eg_proxy(text):
        start = text.index("    value: |\n") + len("    value: |\n")
        end = text.index("\n---", start) + 1
        body = yaml.safe_dump({"stats_config": {"stats_tags": tags, "histogram_bucket_settings": buckets}},
                              default_flow_style=False, sort_keys=False, width=1000)
        return text[:start] + "".join("      " + line + "\n" for line in body.splitlines()) + text[end:]

    rewrite("envoy/istio/bootstrap-override.yaml", istio_bootstrap)
    rewrite("envoy/istio/gateway.yaml", istio_gateway)
    rewrite("envoy/envoy-gateway/gateway.yaml", eg_proxy)


if __name__ == "__main__":
    main()
