#!/usr/bin/env python3
"""Renders the Envoy bootstrap and the filter configuration for a local run.

Used by scripts/run and by the end-to-end tests, so both run the same Envoy setup.

  render.py --wasm PATH --listen-port N --admin-port N [--config FILE]
            [--endpoints ip:port,...] [--cluster NAME=ip:port,...] [--no-filter]
            [--pre-filter FILE] [--eds NAME=FILE] [--ecds FILE] > bootstrap.yaml

--config is the filter configuration: JSON, or YAML as in the reference's docs (a .yaml/.yml
file, or anything that is not JSON), which the workspace's `epp-config` tool validates and
turns into JSON (built on first use). --endpoints, when given, replaces its pool.endpoints.
--eds adds a cluster NAME whose endpoints Envoy reads from FILE (a JSON DiscoveryResponse of
one ClusterLoadAssignment, as eds.py writes it) and re-reads whenever the file is replaced in
its directory: dynamic discovery without a control plane (scripts/run --autoscale).
--ecds delivers the filter's configuration through extension config discovery from FILE
(a YAML DiscoveryResponse written here), as Istio's WasmPlugin does: rendering again with
another --config and the same --ecds FILE replaces the configuration of the running Envoy.
--pre-filter inserts the HTTP filters in FILE (YAML list items, indented as
envoy/wasm-filter.yaml.in) before the picker: e.g. jwt_authn or header_to_metadata, whose
results pool.classification reads.
With pool.metricsEndpoint, a second listener on its port serves the filter's metrics
(envoy/metrics-listener.yaml.in); port 0 there is replaced by a free port.
A listener port 0 lets the kernel choose (read it back from the admin API); an admin port 0
is replaced by a free port, because the bootstrap's `epp-admin` cluster (endpoint discovery)
must name it.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

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
    p.add_argument("--cluster", action="append", default=[],
                   help="an extra STATIC cluster NAME=ip:port,... (e.g. for pool.discovery)")
    p.add_argument("--pre-filter", help="HTTP filters (YAML) to run before the picker")
    p.add_argument("--ecds", help="deliver the filter's configuration from this watched file")
    p.add_argument("--override-host", action="store_true",
                   help="route as the Istio and Envoy Gateway manifests do: the pool is a "
                        "cluster of the configured endpoints with the override_host load "
                        "balancing policy (x-gateway-destination-endpoint, primary then "
                        "fallbacks; round robin without it) and the route retries a failed "
                        "connection on the next endpoint of the list")
    p.add_argument("--eds", action="append", default=[],
                   help="a cluster NAME=FILE whose endpoints come from a watched EDS file")
    a = p.parse_args()

    config = {}
    if a.config:
        with open(a.config) as f:
            text = f.read()
        yaml_file = a.config.endswith((".yaml", ".yml"))
        try:
            config = json.loads(text) if text.strip() and not yaml_file else {}
        except json.JSONDecodeError:
            yaml_file = True
        if yaml_file:
            config = from_yaml(a.config)
    if a.endpoints:
        config.setdefault("pool", {})["endpoints"] = [e for e in a.endpoints.split(",") if e]
    limit = config.get("pool", {}).get("maxRequestBodyBytes", DEFAULT_BODY_LIMIT)
    if not isinstance(limit, int) or limit <= 0:
        limit = DEFAULT_BODY_LIMIT

    admin_port = a.admin_port or free_port()
    metrics = config.get("pool", {}).get("metricsEndpoint")
    if isinstance(metrics, dict) and metrics.get("port") == 0:
        metrics["port"] = free_port()

    def read(name):
        with open(os.path.join(ENVOY_DIR, name)) as f:
            return f.read()

    def block(name):
        return "\n".join("  " + line for line in read(name).splitlines()
                         if line.strip() and not line.startswith("#"))
    filters = ""
    if a.pre_filter:
        with open(a.pre_filter) as f:
            filters = f.read().rstrip("\n") + "\n"
    if not a.no_filter:
        wasm_filter = (read("wasm-filter.yaml.in")
                       .replace("{{PLUGIN_CONFIG}}", json.dumps(json.dumps(config)))
                       .replace("{{WASM}}", json.dumps(os.path.abspath(a.wasm)))
                       .rstrip("\n"))
        filters += write_ecds(a.ecds, wasm_filter) if a.ecds else wasm_filter
    extra = ""
    for spec in a.cluster:
        name, _, addrs = spec.partition("=")
        hosts = []
        for addr in [x for x in addrs.split(",") if x]:
            host, _, port = addr.rpartition(":")
            hosts.append("{endpoint: {address: {socket_address: {address: %s, port_value: %s}}}}"
                         % (json.dumps(host.strip("[]")), int(port)))
        extra += ("  - name: %s\n    connect_timeout: 1s\n    type: STATIC\n"
                  "    load_assignment: {cluster_name: %s, endpoints: [{lb_endpoints: [%s]}]}\n"
                  % (json.dumps(name), json.dumps(name), ", ".join(hosts)))
    for spec in a.eds:
        name, _, path = spec.partition("=")
        path = os.path.abspath(path)
        extra += ("  - name: %s\n    connect_timeout: 1s\n    type: EDS\n"
                  "    eds_cluster_config:\n      service_name: %s\n"
                  "      eds_config:\n        resource_api_version: V3\n"
                  "        path_config_source: {path: %s, watched_directory: {path: %s}}\n"
                  % (json.dumps(name), json.dumps(name), json.dumps(path),
                     json.dumps(os.path.dirname(path))))
    listeners = ""
    if isinstance(metrics, dict) and filters:
        listeners = (read("metrics-listener.yaml.in")
                     .replace("{{METRICS_PORT}}", str(int(metrics.get("port", 0))))
                     .replace("{{METRICS_PATH}}", json.dumps(metrics.get("path", "/metrics")))
                     .replace("{{HTTP_FILTERS}}", filters)
                     .rstrip("\n"))
    out = (read("bootstrap.yaml.in")
           .replace("{{ADMIN_PORT}}", str(admin_port))
           .replace("{{LISTEN_PORT}}", str(a.listen_port))
           .replace("{{BUFFER_LIMIT}}", str(2 * limit + 65536))
           .replace("{{STATS_TAGS}}", block("stats-tags.yaml"))
           .replace("{{HISTOGRAM_BUCKETS}}", block("histogram-buckets.yaml"))
           .replace("{{HTTP_FILTERS}}", filters)
           .replace("{{EXTRA_LISTENERS}}\n", listeners + "\n" if listeners else "")
           .replace("{{EXTRA_CLUSTERS}}\n", extra))
    if a.override_host:
        out = override_host(out, config.get("pool", {}).get("endpoints", []))
    sys.stdout.write(out)


# The route's retries in --override-host (Istio's default retry policy, less the status
# codes: a model server's 503 is an answer, not a reason to send the prompt again).
RETRY = ("retry_policy: {retry_on: \"connect-failure,refused-stream,reset-before-request\", "
         "num_retries: 2}")


def override_host(bootstrap, endpoints):
    """The bootstrap with the ORIGINAL_DST pool replaced by a STATIC cluster of
    `endpoints` balanced by override_host, and retries on the route."""
    route = "route: {cluster: pool, timeout: 0s}"
    start = bootstrap.index("\n  - name: pool\n") + 1
    end = bootstrap.index("\n  - name: epp-metrics\n") + 1
    hosts = []
    for e in endpoints:
        addr = e.get("address", "") if isinstance(e, dict) else e
        host, _, port = addr.rpartition(":")
        hosts.append("{endpoint: {address: {socket_address: {address: %s, port_value: %d}}}}"
                     % (json.dumps(host.strip("[]")), int(port)))
    lb = "type.googleapis.com/envoy.extensions.load_balancing_policies"
    cluster = (
        "  - name: pool\n    connect_timeout: 2s\n    type: STATIC\n"
        "    load_assignment: {cluster_name: pool, endpoints: [{lb_endpoints: [%s]}]}\n"
        "    load_balancing_policy:\n      policies:\n      - typed_extension_config:\n"
        "          name: envoy.load_balancing_policies.override_host\n"
        "          typed_config:\n"
        "            \"@type\": %s.override_host.v3.OverrideHost\n"
        "            override_host_sources: [{header: x-gateway-destination-endpoint}]\n"
        "            fallback_policy:\n              policies:\n"
        "              - typed_extension_config:\n"
        "                  name: envoy.load_balancing_policies.round_robin\n"
        "                  typed_config: {\"@type\": %s.round_robin.v3.RoundRobin}\n"
        "    circuit_breakers:\n      thresholds: [{max_connections: 100000, "
        "max_pending_requests: 100000, max_requests: 100000}]\n"
        % (", ".join(hosts), lb, lb))
    return (bootstrap[:start] + cluster + bootstrap[end:]).replace(
        route, "route: {cluster: pool, timeout: 0s, %s}" % RETRY)


def write_ecds(path, wasm_filter):
    """Writes the Wasm filter's typed_config (from the template) into `path` as an
    extension config discovery response, atomically (Envoy re-reads a file moved into its
    watched directory); returns the HTTP filter entry that subscribes to it."""
    lines = wasm_filter.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "typed_config:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = "\n".join("  " + line[indent:] for line in lines[start:])
    path = os.path.abspath(path)
    doc = ("version_info: %s\nresources:\n"
           "- \"@type\": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig\n"
           "  name: epp\n%s\n" % (json.dumps(str(time.time_ns())), body))
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)
    return ("          - name: epp\n"
            "            config_discovery:\n"
            "              config_source:\n"
            "                path_config_source: {path: %s, watched_directory: {path: %s}}\n"
            "              type_urls: [type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm]"
            % (json.dumps(path), json.dumps(os.path.dirname(path))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def from_yaml(path):
    """Validates a YAML (or JSON) EndpointPickerConfig with `epp-config` and returns it as JSON.

    The tool is (re)built first, a no-op when it is up to date, so it always validates with
    the same code as the filter being rendered.
    """
    build = ["cargo", "build", "--quiet", "--release", "-p", "filter", "--features", "cli",
             "--bin", "epp-config"]
    r = subprocess.run(build, cwd=ROOT)
    if r.returncode != 0:
        sys.exit("render.py: cannot build the epp-config tool (" + " ".join(build) + ")")
    tool = os.path.join(ROOT, "target", "release", "epp-config")
    r = subprocess.run([tool, path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"render.py: {r.stderr.strip()}")
    return json.loads(r.stdout)


if __name__ == "__main__":
    main()
