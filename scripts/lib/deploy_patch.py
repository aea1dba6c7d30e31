"""Envoy configurations shaped like the ones Istio and Envoy Gateway generate for a gateway,
with the manifests of envoy/istio and envoy/envoy-gateway applied to them.

Used by test_deploy.py. What this reproduces of each control plane: the gateway listener's
HTTP connection manager and router, the model servers' EDS cluster (named and load-balanced
as the control plane names it; here EDS is read from a file instead of ADS), the admin
address, Istio's stats rules and stats matcher from its bootstrap template plus the proxy
config annotations, and EG's per-route Wasm filter (disabled on the listener, enabled on the
route, code from EG's HTTP server). What it does not: xDS delivery itself, istio-agent's
image pull (the EXTENSION_CONFIG is resolved to the local .wasm, as the agent does after
pulling), mTLS/SDS, Istio's own telemetry filters, EG's ext-auth/rate-limit machinery,
Kubernetes objects (Service, InferencePool) and their translation.

The EnvoyFilter applier implements only what our manifests use: EXTENSION_CONFIG ADD,
HTTP_FILTER INSERT_BEFORE (subFilter match), NETWORK_FILTER MERGE (the connection manager),
LISTENER MERGE, CLUSTER ADD and CLUSTER MERGE
(service/portNumber match), with protobuf merge semantics (messages merge, lists append,
scalars replace). The EnvoyPatchPolicy applier implements JSON Patch `add`/`replace` with
`path`, a `jsonPath` of the form `..http_filters[?(@.name=="...")]<.field>*`, and `add` with
an empty path (a new resource).
"""
import copy
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ISTIO = os.path.join(ROOT, "envoy", "istio")
EG = os.path.join(ROOT, "envoy", "envoy-gateway")
ENVOY = os.path.join(ROOT, ".venv", "bin", "envoy")

ROUTER = {"name": "envoy.filters.http.router",
          "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ISTIO_POOL = "outbound|8000||vllm-llama3-8b.default.svc.cluster.local"
EG_POOL = "httproute/default/llm/rule/0"
EG_LISTENER = "default/inference-gateway/http"


def load(path, kind=None):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    return [d for d in docs if kind is None or d["kind"] == kind]


def istio_envoyfilter():
    return load(os.path.join(ISTIO, "envoyfilter.yaml"), "EnvoyFilter")[0]


def istio_bootstrap_override():
    cm = load(os.path.join(ISTIO, "bootstrap-override.yaml"), "ConfigMap")[0]
    return json.loads(cm["data"]["custom_bootstrap.json"])


def istio_gateway_annotations():
    return load(os.path.join(ISTIO, "gateway.yaml"), "Gateway")[0]["spec"]["infrastructure"]["annotations"]


def merge(dst, src):
    """Protobuf merge of JSON-shaped messages: maps merge, lists append, scalars replace."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict) and \
                v.get("@type", dst[k].get("@type")) == dst[k].get("@type"):
            merge(dst[k], v)
        elif isinstance(v, list) and isinstance(dst.get(k), list):
            dst[k] = dst[k] + copy.deepcopy(v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


def hcms(bootstrap):
    for listener in bootstrap["static_resources"]["listeners"]:
        chains = listener.get("filter_chains", []) + \
            ([listener["default_filter_chain"]] if "default_filter_chain" in listener else [])
        for chain in chains:
            for f in chain["filters"]:
                if f["name"] == "envoy.filters.network.http_connection_manager":
                    yield listener, f["typed_config"]


def local_code(wasm_cfg, wasm_path):
    """What istio-agent (after pulling) and EG's HTTP server amount to: the code as a local file."""
    cfg = copy.deepcopy(wasm_cfg)
    cfg["config"]["vm_config"]["code"] = {"local": {"filename": wasm_path}}
    return cfg


def apply_envoyfilter(bootstrap, ef, wasm_path):
    ecds = {}
    for p in ef["spec"]["configPatches"]:
        what, op, value = p["applyTo"], p["patch"]["operation"], p["patch"]["value"]
        match = p.get("match", {})
        assert match.get("context", "GATEWAY") == "GATEWAY", p
        if (what, op) == ("EXTENSION_CONFIG", "ADD"):
            ecds[value["name"]] = value["typed_config"]
        elif (what, op) == ("HTTP_FILTER", "INSERT_BEFORE"):
            sub = match["listener"]["filterChain"]["filter"]["subFilter"]["name"]
            for _, hcm in hcms(bootstrap):
                names = [f["name"] for f in hcm["http_filters"]]
                hcm["http_filters"].insert(names.index(sub), copy.deepcopy(value))
        elif (what, op) == ("NETWORK_FILTER", "MERGE"):
            name = match["listener"]["filterChain"]["filter"]["name"]
            assert name == "envoy.filters.network.http_connection_manager", name
            for _, hcm in hcms(bootstrap):
                merge(hcm, value["typed_config"])
        elif (what, op) == ("LISTENER", "MERGE"):
            for listener in bootstrap["static_resources"]["listeners"]:
                merge(listener, value)
        elif (what, op) == ("CLUSTER", "ADD"):
            bootstrap["static_resources"]["clusters"].append(copy.deepcopy(value))
        elif (what, op) == ("CLUSTER", "MERGE"):
            c = match["cluster"]
            name = f"outbound|{c['portNumber']}||{c['service']}"
            hits = [x for x in bootstrap["static_resources"]["clusters"] if x["name"] == name]
            assert hits, f"no cluster {name}"
            for x in hits:
                merge(x, value)
        else:
            raise AssertionError(f"patch {what} {op} not implemented by the applier")
    # ECDS: the filter entry gets the extension config istio-agent delivers (code made local).
    for _, hcm in hcms(bootstrap):
        for i, f in enumerate(hcm["http_filters"]):
            if "config_discovery" in f:
                hcm["http_filters"][i] = {"name": f["name"],
                                          "typed_config": local_code(ecds[f["name"]], wasm_path)}
    return bootstrap


def eds_cluster(name, eds_path, lb_policy):
    return {"name": name, "type": "EDS", "connect_timeout": "10s", "lb_policy": lb_policy,
            "eds_cluster_config": {"service_name": name,
                                   "eds_config": {"path_config_source": {"path": eds_path},
                                                  "resource_api_version": "V3"}},
            "circuit_breakers": {"thresholds": [{"max_connections": 4294967295,
                                                 "max_pending_requests": 4294967295,
                                                 "max_requests": 4294967295}]}}


def gateway_listener(name, port, route_cluster, filters, per_route=None):
    route = {"match": {"prefix": "/"}, "route": {"cluster": route_cluster, "timeout": "0s"}}
    if per_route:
        route["typed_per_filter_config"] = per_route
    return {"name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {"@type": HCM_TYPE, "stat_prefix": name.replace("/", "_"),
                                 "route_config": {"name": name, "virtual_hosts": [
                                     {"name": "gw", "domains": ["*"], "routes": [route]}]},
                                 "http_filters": filters + [copy.deepcopy(ROUTER)]}}]}]}


def istio_extra_stat_tags_rules(labels):
    """The stats_tags rules Istio's bootstrap template writes for `extraStatTags: labels`."""
    return [{"tag_name": label, "regex": r"(%s=\.=(.*?);\.;)" % label} for label in labels]


def istio_gateway(wasm_path, eds_path, admin_port, listen_port=0, override=None):
    """An Istio gateway proxy's configuration for the Gateway + HTTPRoute of gateway.yaml,
    with envoyfilter.yaml, the bootstrap override (or `override`) and the proxy-config
    annotations applied."""
    ann = istio_gateway_annotations()
    proxy = json.loads(ann["proxy.istio.io/config"])
    buckets = json.loads(ann["sidecar.istio.io/statsHistogramBuckets"])
    # Istio's bootstrap template: fixed tag rules (no extraStatTags), the inclusion list.
    rules = [
        {"tag_name": "cluster_name", "regex": r"^cluster\.((.+?(\..+?\.svc\.cluster\.local)?)\.)"},
        {"tag_name": "tcp_prefix", "regex": r"^tcp\.((.*?)\.)\w+?$"},
        {"tag_name": "response_code", "regex": r"_rq(_(\d{3}))$"},
        {"tag_name": "response_code_class", "regex": r"_rq(_(\dxx))$"},
        {"tag_name": "cache", "regex": r"(cache\.(.+?)\.)"},
        {"tag_name": "component", "regex": r"(component\.(.+?)\.)"},
        {"tag_name": "tag", "regex": r"(tag\.(.+?);\.)"},
        {"tag_name": "wasm_filter", "regex": r"(wasm_filter\.(.+?)\.)"},
    ]
    patterns = [{"prefix": "reporter="}] + \
        [{"prefix": p} for p in proxy["proxyStatsMatcher"]["inclusionPrefixes"]] + \
        [{"prefix": "component"}, {"prefix": "istio"}]
    # Istio's template always holds the connection monitor; its limit comes from the proxy
    # metadata (pkg/bootstrap/config.go: unlimited, math.MaxInt32, unless set).
    connections = int(proxy.get("proxyMetadata", {}).get(
        "ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS", 2147483647))
    bootstrap = {
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                             "downstream_connections.v3.DownstreamConnectionsConfig",
                             "max_active_downstream_connections": connections}}]},
        "node": {"id": "router~10.0.0.9~inference-gateway-istio-0.default~default.svc.cluster.local",
                 "cluster": "inference-gateway-istio.default"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": {"use_all_default_tags": False, "stats_tags": rules,
                         "histogram_bucket_settings": [{"match": {"prefix": k}, "buckets": v}
                                                       for k, v in buckets.items()],
                         "stats_matcher": {"inclusion_list": {"patterns": patterns}}},
        "stats_flush_interval": "1s",
        "static_resources": {
            "listeners": [gateway_listener("0.0.0.0_80", listen_port, ISTIO_POOL, [])],
            "clusters": [eds_cluster(ISTIO_POOL, eds_path, "LEAST_REQUEST")],
        },
    }
    merge(bootstrap, istio_bootstrap_override() if override is None else override)
    apply_envoyfilter(bootstrap, istio_envoyfilter(), wasm_path)
    for c in bootstrap["static_resources"]["clusters"]:  # Istio's admin port is 15000
        if c["name"] == "epp-admin":
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
                "socket_address"]["port_value"] = admin_port
    return bootstrap


def eg_manifests():
    out = {}
    for name in sorted(os.listdir(EG)):
        if name.endswith(".yaml"):
            for d in load(os.path.join(EG, name)):
                out.setdefault(d["kind"], []).append(d)
    return out


def json_pointer_set(doc, pointer, value, op):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    node = doc
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if isinstance(node, list):
        if op == "add":
            node.insert(len(node) if last == "-" else int(last), copy.deepcopy(value))
        else:
            node[int(last)] = copy.deepcopy(value)
    else:
        assert op == "add" or last in node, f"replace of a missing {pointer}"
        node[last] = copy.deepcopy(value)


def json_path_pointers(doc, expr):
    m = re.fullmatch(r'\.\.http_filters\[\?\(@\.name=="([^"]+)"\)\]((?:\.\w+)*)', expr)
    assert m, f"jsonPath form not implemented by the applier: {expr}"
    name, tail = m.group(1), [t for t in m.group(2).split(".") if t]
    found = []

    def walk(node, ptr):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "http_filters" and isinstance(v, list):
                    for i, f in enumerate(v):
                        if f.get("name") == name:
                            found.append(ptr + f"/http_filters/{i}" + "".join("/" + t for t in tail))
                walk(v, ptr + "/" + k.replace("~", "~0").replace("/", "~1"))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{ptr}/{i}")
    walk(doc, "")
    assert found, f"jsonPath {expr} matched nothing"
    return found


def apply_patch_policy(bootstrap, policy):
    res = bootstrap["static_resources"]
    kinds = {"type.googleapis.com/envoy.config.listener.v3.Listener": res["listeners"],
             "type.googleapis.com/envoy.config.cluster.v3.Cluster": res["clusters"]}
    for p in policy["spec"]["jsonPatches"]:
        pool, op = kinds[p["type"]], p["operation"]
        assert op["op"] in ("add", "replace"), op
        hits = [r for r in pool if r["name"] == p["name"]]
        if not hits and op["op"] == "add" and op.get("path", "") == "" and "jsonPath" not in op:
            pool.append(copy.deepcopy(op["value"]))
            continue
        assert len(hits) == 1, f"no {p['type']} named {p['name']}"
        pointers = json_path_pointers(hits[0], op["jsonPath"]) if "jsonPath" in op else [""]
        for ptr in pointers:
            json_pointer_set(hits[0], ptr + op.get("path", ""), op["value"], op["op"])
    return bootstrap


def envoy_gateway(wasm_path, eds_path, admin_port, listen_port=0):
    """The Envoy Gateway proxy's configuration for the Gateway + HTTPRoute + policies of
    envoy/envoy-gateway, with the EnvoyPatchPolicy and the EnvoyProxy bootstrap merge applied."""
    m = eg_manifests()
    ext = m["EnvoyExtensionPolicy"][0]
    wasm = ext["spec"]["wasm"][0]
    ns, pol = ext["metadata"]["namespace"], ext["metadata"]["name"]
    wasm_name = f"envoyextensionpolicy/{ns}/{pol}/wasm/0"
    filter_name = "envoy.filters.http.wasm/" + wasm_name
    # EG's translation of the EnvoyExtensionPolicy (internal/xds/translator/wasm.go).
    wasm_filter = {"name": filter_name, "disabled": True, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {"name": wasm["name"], "root_id": wasm["rootID"],
                   "fail_open": wasm.get("failOpen", False),
                   "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                     "value": json.dumps(wasm["config"])},
                   "vm_config": {"vm_id": wasm_name, "runtime": "envoy.wasm.runtime.v8",
                                 "code": {"local": {"filename": wasm_path}}}}}}
    per_route = {filter_name: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig",
                               "config": {}}}
    # BackendTrafficPolicy loadBalancer.endpointOverride → override_host with header sources,
    # falling back to the configured policy (internal/xds/translator/cluster.go).
    lb = m["BackendTrafficPolicy"][0]["spec"]["loadBalancer"]
    fallback = {"RoundRobin": "round_robin", "LeastRequest": "least_request", "Random": "random"}[lb["type"]]
    fallback_type = "".join(w.capitalize() for w in fallback.split("_"))
    cluster = eds_cluster(EG_POOL, eds_path, "LEAST_REQUEST")
    del cluster["lb_policy"]
    cluster["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"header": e["header"]} for e in lb["endpointOverride"]["extractFrom"]],
            "fallback_policy": {"policies": [{"typed_extension_config": {
                "name": f"envoy.load_balancing_policies.{fallback}",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                                 f"{fallback}.v3.{fallback_type}"}}}]}}}}]}
    bootstrap = {
        "node": {"id": "envoy-default-inference-gateway-0", "cluster": "default/inference-gateway"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_flush_interval": "1s",
        "static_resources": {
            "listeners": [gateway_listener(EG_LISTENER, listen_port, EG_POOL, [wasm_filter], per_route)],
            "clusters": [cluster],
        },
    }
    # EG's bootstrap template: the connection monitor always; with a memory limit on the
    # proxy container, the heap monitor at 80 % of it and its two actions.
    monitors = [{"name": "envoy.resource_monitors.global_downstream_max_connections",
                 "typed_config": {"@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                                  "downstream_connections.v3.DownstreamConnectionsConfig",
                                  "max_active_downstream_connections": 50000}}]
    actions = []
    for proxy in m.get("EnvoyProxy", []):
        limit = (proxy["spec"].get("provider", {}).get("kubernetes", {}).get("envoyDeployment", {})
                 .get("container", {}).get("resources", {}).get("limits", {}).get("memory"))
        if limit:
            heap = "envoy.resource_monitors.fixed_heap"
            monitors.append({"name": heap, "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                "max_heap_size_bytes": int(quantity(limit) * 0.8)}})
            actions = [{"name": "envoy.overload_actions.shrink_heap",
                        "triggers": [{"name": heap, "threshold": {"value": 0.95}}]},
                       {"name": "envoy.overload_actions.stop_accepting_requests",
                        "triggers": [{"name": heap, "threshold": {"value": 0.98}}]}]
    bootstrap["overload_manager"] = {"refresh_interval": "0.25s", "resource_monitors": monitors}
    if actions:
        bootstrap["overload_manager"]["actions"] = actions
    # ClientTrafficPolicy on the Gateway → the listener's connection manager
    # (internal/xds/translator/listener.go).
    for ctp in m.get("ClientTrafficPolicy", []):
        apply_client_traffic_policy(bootstrap, ctp["spec"])
    for proxy in m.get("EnvoyProxy", []):
        b = proxy["spec"].get("bootstrap")
        if b:
            assert b["type"] == "Merge", b
            merge(bootstrap, yaml.safe_load(b["value"]))
    for policy in m["EnvoyPatchPolicy"]:
        apply_patch_policy(bootstrap, policy)
    for c in bootstrap["static_resources"]["clusters"]:  # EG's admin port is 19000
        if c["name"] == "epp-admin":
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
                "socket_address"]["port_value"] = admin_port
    return bootstrap


def quantity(q):
    """A Kubernetes quantity (e.g. "2Gi", "512Mi", "1G") in bytes."""
    m = re.fullmatch(r"(\d+)([KMGT]i?)?", str(q))
    assert m, f"quantity form not implemented: {q}"
    unit = {None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return int(m.group(1)) * unit


def apply_client_traffic_policy(bootstrap, spec):
    """The fields of a ClientTrafficPolicy that envoy/envoy-gateway uses, as EG translates
    them onto the listener and its connection manager."""
    http_t = spec.get("timeout", {}).get("http", {})
    conn = spec.get("connection", {})
    for listener, hcm in list(hcms(bootstrap)):
        for field, key in [("requestHeadersReceivedTimeout", "request_headers_timeout"),
                           ("streamIdleTimeout", "stream_idle_timeout"),
                           ("requestReceivedTimeout", "request_timeout")]:
            if field in http_t:
                hcm[key] = http_t[field]
        if "idleTimeout" in http_t:
            hcm.setdefault("common_http_protocol_options", {})["idle_timeout"] = http_t["idleTimeout"]
        if "http2" in spec:
            h2 = spec["http2"]
            opts = hcm.setdefault("http2_protocol_options", {})
            for field, key in [("maxConcurrentStreams", "max_concurrent_streams"),
                               ("initialStreamWindowSize", "initial_stream_window_size"),
                               ("initialConnectionWindowSize", "initial_connection_window_size")]:
                if field in h2:
                    opts[key] = quantity(h2[field]) if isinstance(h2[field], str) else h2[field]
        if "bufferLimit" in conn:
            listener["per_connection_buffer_limit_bytes"] = quantity(conn["bufferLimit"])
    if "connectionLimit" in conn:
        # EG puts a connection_limit network filter first in each chain.
        limit = {"name": "envoy.filters.network.connection_limit", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.connection_limit.v3.ConnectionLimit",
            "stat_prefix": "connection_limit",
            "max_connections": conn["connectionLimit"]["value"]}}
        for listener in bootstrap["static_resources"]["listeners"]:
            for chain in listener.get("filter_chains", []):
                chain["filters"].insert(0, copy.deepcopy(limit))


def bare_bootstrap(http_filters, ads=False):
    """A minimal bootstrap around some HTTP filters (for fragments checked on their own)."""
    b = {"node": {"id": "epp-test", "cluster": "epp-test"},
         "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
         "static_resources": {
             "listeners": [gateway_listener("l", 0, "epp-admin", copy.deepcopy(http_filters))],
             "clusters": [{"name": "epp-admin", "connect_timeout": "1s", "type": "STATIC",
                           "load_assignment": {"cluster_name": "epp-admin", "endpoints": [{
                               "lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                                   "address": "127.0.0.1", "port_value": 15000}}}}]}]}}]}}
    if ads:
        b["dynamic_resources"] = {"ads_config": {
            "api_type": "GRPC", "transport_api_version": "V3",
            "grpc_services": [{"envoy_grpc": {"cluster_name": "epp-admin"}}]}}
        b["static_resources"]["clusters"][0]["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}}
    return b


def local_bootstrap(wasm_path):
    """The project's own local bootstrap (envoy/bootstrap.yaml.in) for a module file."""
    r = subprocess.run([os.path.join(ROOT, "scripts", "lib", "render.py"), "--wasm", wasm_path,
                        "--endpoints", "127.0.0.1:9"], capture_output=True, text=True, check=True)
    return yaml.safe_load(r.stdout)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningEnvoy:
    """Envoy started on a bootstrap; stopped (by its PID) on exit."""

    def __init__(self, bootstrap, label, admin_port):
        self.dir = tempfile.TemporaryDirectory()
        self.label = label
        path = os.path.join(self.dir.name, "bootstrap.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(bootstrap, f)
        self.log = os.path.join(self.dir.name, "envoy.log")
        self.admin = f"http://127.0.0.1:{admin_port}"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([ENVOY, "-c", path, "--concurrency", "2",
                                          "--base-id", str(admin_port), "-l", "warning",
                                          "--file-flush-interval-msec", "100"],
                                         stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.label}: envoy exited {self.proc.returncode}:\n{self.log_text()}")
            try:
                with urllib.request.urlopen(self.admin + "/ready", timeout=1) as r:
                    if r.read().strip() == b"LIVE":
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.label}: envoy not ready in {timeout} s:\n{self.log_text()}")

    def get(self, path):
        with urllib.request.urlopen(self.admin + path, timeout=5) as r:
            return r.read().decode()

    def log_text(self):
        with open(self.log) as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()


def run_envoy_until_ready(test, bootstrap, label):
    admin_port = free_port()
    bootstrap = copy.deepcopy(bootstrap)
    bootstrap["admin"]["address"]["socket_address"]["port_value"] = admin_port
    for c in bootstrap["static_resources"]["clusters"]:
        if c["name"] == "epp-admin":
            c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
                "socket_address"]["port_value"] = admin_port
    envoy = RunningEnvoy(bootstrap, label, admin_port)
    try:
        envoy.wait_ready()
        stats = envoy.get("/stats?filter=wasm")
        test.assertRegex(stats, r"wasm\.envoy\.wasm\.runtime\.v8\.created: [1-9]", label)
    finally:
        envoy.stop()
