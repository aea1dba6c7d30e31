#!/usr/bin/env python3
"""Renders the Envoy bootstrap and the filter configuration for a local run.

Used by scripts/run and by the end-to-end tests, so both run the same Envoy setup.

  render.py --wasm PATH --listen-port N --admin-port N [--config FILE]
            [--endpoints ip:port,...] [--no-filter] > bootstrap.yaml

--config is the filter configuration (JSON); --endpoints, when given, replaces its
pool.endpoints. Port 0 lets the kernel choose (read the ports back from the admin API).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENVOY_DIR = os.path.join(ROOT, "envoy")
DEFAULT_BODY_LIMIT = 4 * 1024 * 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--wasm", required=True)
    p.add_argument("--listen-port", type=int, default=0)
    p.add_argument("--admin-port", type=int, default=0)
    p.add_argument("--config", help="filter configuration file (JSON)")
    p.add_argument("--endpoints", help="comma-separated ip:port list for pool.endpoints")
    p.add_argument("--no-filter", action="store_true", help="plain Envoy, for comparisons")
    a = p.parse_args()

    config = {}
    if a.config:
        with open(a.config) as f:
            text = f.read()
        try:
            config = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            sys.exit(f"render.py: {a.config} is not valid JSON: {e}")
    if a.endpoints:
        config.setdefault("pool", {})["endpoints"] = [e for e in a.endpoints.split(",") if e]
    limit = config.get("pool", {}).get("maxRequestBodyBytes", DEFAULT_BODY_LIMIT)
    if not isinstance(limit, int) or limit <= 0:
        limit = DEFAULT_BODY_LIMIT

    def read(name):
        with open(os.path.join(ENVOY_DIR, name)) as f:
            return f.read()

    def block(name):
        return "\n".join("  " + line for line in read(name).splitlines()
                         if line.strip() and not line.startswith("#"))
    filters = ""
    if not a.no_filter:
        filters = (read("wasm-filter.yaml.in")
                   .replace("{{PLUGIN_CONFIG}}", json.dumps(json.dumps(config)))
                   .replace("{{WASM}}", json.dumps(os.path.abspath(a.wasm)))
                   .rstrip("\n"))
    out = (read("bootstrap.yaml.in")
           .replace("{{ADMIN_PORT}}", str(a.admin_port))
           .replace("{{LISTEN_PORT}}", str(a.listen_port))
           .replace("{{BUFFER_LIMIT}}", str(2 * limit + 65536))
           .replace("{{STATS_TAGS}}", block("stats-tags.yaml"))
           .replace("{{HISTOGRAM_BUCKETS}}", block("histogram-buckets.yaml"))
           .replace("{{HTTP_FILTERS}}", filters))
    sys.stdout.write(out)


if __name__ == "__main__":
    main()
