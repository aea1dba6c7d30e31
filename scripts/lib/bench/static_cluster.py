#!/usr/bin/env python3
"""Turns the bootstrap rendered by scripts/lib/render.py --no-filter into plain Envoy
load balancing over the same servers: the `pool` cluster (ORIGINAL_DST keyed on
x-gateway-destination-endpoint) becomes a STATIC cluster with --lb-policy
(ROUND_ROBIN, LEAST_REQUEST, ...). Everything else (listener, HCM, router, admin, stats
tags, circuit breakers) stays as rendered, so the baselines differ from the filter's
bootstrap only in how the endpoint is chosen.

  render.py --no-filter ... | static_cluster.py --lb-policy ROUND_ROBIN --endpoints a:1,b:2
"""
import argparse
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lb-policy", required=True)
    p.add_argument("--endpoints", required=True, help="comma-separated ip:port list")
    a = p.parse_args()
    text = sys.stdin.read()
    marker = "\n  clusters:\n"
    i = text.find(marker)
    if i < 0 or "type: ORIGINAL_DST" not in text[i:]:
        sys.exit("static_cluster.py: the rendered bootstrap no longer ends with the ORIGINAL_DST `pool` "
                 "cluster; update scripts/lib/bench/static_cluster.py")
    breakers = ""
    for line in text[i:].splitlines():
        if line.strip().startswith("thresholds:"):
            breakers = "    circuit_breakers:\n" + line + "\n"
    eps = []
    for e in a.endpoints.split(","):
        host, port = e.rsplit(":", 1)
        eps.append(f"        - endpoint: {{address: {{socket_address: {{address: {host}, port_value: {int(port)}}}}}}}")
    cluster = (
        "  - name: pool\n"
        "    connect_timeout: 2s\n"
        "    type: STATIC\n"
        f"    lb_policy: {a.lb_policy}\n"
        + breakers +
        "    load_assignment:\n"
        "      cluster_name: pool\n"
        "      endpoints:\n"
        "      - lb_endpoints:\n"
        + "\n".join(eps) + "\n"
    )
    sys.stdout.write(text[:i] + marker + cluster)


if __name__ == "__main__":
    main()
