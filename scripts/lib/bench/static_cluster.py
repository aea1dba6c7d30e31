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
    lines = sys.stdin.read().splitlines(keepends=True)
    # The `pool` cluster block: its `- name: pool` line and the more-indented lines after it.
    try:
        first = next(n for n, l in enumerate(lines) if l.rstrip() == "  - name: pool")
    except StopIteration:
        sys.exit("static_cluster.py: no `  - name: pool` cluster in the rendered bootstrap; "
                 "update scripts/lib/bench/static_cluster.py")
    last = first + 1
    while last < len(lines) and (lines[last].startswith("    ") or not lines[last].strip()):
        last += 1
    block = "".join(lines[first:last])
    if "type: ORIGINAL_DST" not in block:
        sys.exit("static_cluster.py: the `pool` cluster is no longer ORIGINAL_DST; "
                 "update scripts/lib/bench/static_cluster.py")
    breakers = ""
    for line in block.splitlines():
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
    sys.stdout.write("".join(lines[:first]) + cluster + "".join(lines[last:]))


if __name__ == "__main__":
    main()
