//! The configuration tool as `scripts/run --config` uses it (through render.py): the
//! README's example YAML validates and becomes the filter's JSON; a bad file is refused
//! with the field path and the reason before Envoy ever starts.

use std::process::Command;
use tests::{paths, scratch_dir};

fn render(config: &std::path::Path) -> std::process::Output {
    Command::new("python3")
        .arg(paths::render())
        .args(["--wasm", "filter.wasm", "--config"])
        .arg(config)
        .output()
        .expect("run render.py")
}

#[test]
fn the_readme_example_is_a_valid_configuration() {
    let readme = std::fs::read_to_string(paths::root().join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Configuration")
        .expect("Configuration section")..];
    let start = section.find("```yaml\n").expect("a yaml example") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("```").unwrap()];
    let dir = scratch_dir("tool");
    let path = dir.join("example.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = render(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bootstrap = String::from_utf8_lossy(&out.stdout);
    // The plugin configuration is embedded as a JSON string.
    assert!(bootstrap.contains("vllm-llama3-8b"), "{bootstrap}");
    assert!(bootstrap.contains("weighted-random-picker"), "{bootstrap}");
}

#[test]
fn a_bad_yaml_file_is_refused_with_the_field_and_the_reason() {
    let dir = scratch_dir("tool");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n    weight: 2000000\nplugins:\n- type: queue-scorer\n",
    )
    .unwrap();
    let out = render(&path);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("schedulingProfiles[0].plugins[0].weight") && err.contains("out of range"),
        "{err}"
    );
}

/// The configurations of `tests/configs/llm-d-router/` (written for this repository in
/// llm-d-router's form).
fn llm_d_router_configs() -> Vec<std::path::PathBuf> {
    let dir = paths::root().join("tests/configs/llm-d-router");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The document `epp-config` prints for a file (render.py has built the tool).
fn as_json(config: &std::path::Path) -> serde_json::Value {
    let out = Command::new(paths::root().join("target/release/epp-config"))
        .arg(config)
        .output()
        .expect("run epp-config");
    assert!(
        out.status.success(),
        "{}: {}",
        config.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Each loads as `scripts/run --config` loads it: the first through render.py (which
/// builds the tool), all through the tool render.py runs.
#[test]
fn llm_d_router_configurations_load() {
    let files = llm_d_router_configs();
    let out = render(&files[0]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in &files {
        let doc = as_json(file);
        assert_eq!(doc["kind"], "EndpointPickerConfig", "{}", file.display());
    }
}

/// Every plugin type, parameter (as a dotted path into `parameters`) and top-level field
/// that llm-d-router v0.10's own configurations (`deploy/config/`, its integration-test
/// default and perf profiles) use, apart from the request parsers (`requestHandler`,
/// `passthrough-parser`, issue #37) and the two refused types below: each appears in one of
/// our configurations, which all load.
const REFERENCE_USES: &[&str] = &[
    "apiVersion=llm-d.ai/v1alpha1",
    "apiVersion=inference.networking.x-k8s.io/v1alpha1",
    "featureGates",
    "dataLayer.sources",
    "flowControl.saturationDetector",
    "flowControl.usageLimitPolicyPluginRef",
    "flowControl.defaultPriorityBand.fairnessPolicyRef",
    "active-request-scorer",
    "always-disagg-multimodal-decider",
    "approx-prefix-cache-producer:maxPrefixTokensToMatch",
    "approx-prefix-cache-producer:lruCapacityPerServer",
    "approx-prefix-cache-producer:blockSizeTokens",
    "approx-prefix-cache-producer:autoTune",
    "burst-prefix-cache-producer:windowDurationMs",
    "burst-prefix-cache-producer:maxPerReplica",
    "burst-prefix-cache-producer:minColocateBlocks",
    "core-metrics-extractor",
    "data-parallel-profile-handler:primaryPort",
    "decode-filter",
    "disagg-profile-handler:deciders.prefill",
    "disagg-profile-handler:deciders.encode",
    "encode-filter",
    "endpoint-notification-source",
    "kv-cache-utilization-scorer",
    "load-aware-scorer",
    "max-score-picker",
    "metrics-data-source",
    "no-hit-lru-scorer:lruSize",
    "no-hit-lru-scorer:prefixMatchInfoProducerName",
    "precise-prefix-cache-producer:tokenProcessorConfig.blockSize",
    "precise-prefix-cache-producer:tokenProcessorConfig.blockSizeTokens",
    "precise-prefix-cache-producer:tokenProcessorConfig.hashSeed",
    "precise-prefix-cache-producer:kvEventsConfig.zmqEndpoint",
    "precise-prefix-cache-producer:kvEventsConfig.topicFilter",
    "precise-prefix-cache-producer:kvEventsConfig.concurrency",
    "precise-prefix-cache-producer:kvEventsConfig.discoverPods",
    "precise-prefix-cache-producer:kvEventsConfig.podDiscoveryConfig.socketPort",
    "precise-prefix-cache-producer:indexerConfig.kvBlockIndexConfig.enableMetrics",
    "precise-prefix-cache-producer:indexerConfig.kvBlockIndexConfig.metricsLoggingInterval",
    "precise-prefix-cache-producer:speculativeIndexing",
    "prefill-filter",
    "prefix-based-pd-decider:nonCachedTokens",
    "prefix-cache-scorer:prefixMatchInfoProducerName",
    "probabilistic-admitter",
    "program-aware-fairness",
    "queue-scorer",
    "random-picker",
    "single-profile-handler",
    "soft-reflective-ceiling-policy",
    "token-producer:modelName",
    "token-producer:vllm.url",
    "topology-affinity-filter",
    "topology-affinity-scorer",
    "topology-extractor",
    "utilization-detector:queueDepthThreshold",
    "utilization-detector:kvCacheUtilThreshold",
    "lora-affinity-scorer",
];

fn parameter_paths(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
    if let Some(o) = v.as_object() {
        for (k, v) in o {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            parameter_paths(&path, v, out);
        }
    }
}

#[test]
fn our_configurations_use_everything_the_references_configurations_use() {
    // Built by the first render.
    assert!(render(&llm_d_router_configs()[0]).status.success());
    let mut used: Vec<String> = Vec::new();
    for file in llm_d_router_configs() {
        let doc = as_json(&file);
        if let Some(v) = doc.get("apiVersion").and_then(|v| v.as_str()) {
            used.push(format!("apiVersion={v}"));
        }
        parameter_paths("", &doc, &mut used);
        for p in doc["plugins"].as_array().into_iter().flatten() {
            let t = p["type"].as_str().unwrap().to_string();
            let mut params = Vec::new();
            parameter_paths("", &p["parameters"], &mut params);
            used.extend(params.into_iter().map(|q| format!("{t}:{q}")));
            used.push(t);
        }
    }
    let missing: Vec<&&str> = REFERENCE_USES
        .iter()
        .filter(|u| !used.iter().any(|x| x == **u))
        .collect();
    assert!(missing.is_empty(), "not exercised: {missing:?}");
}

/// The two llm-d-router types groups refused on purpose: each names the field and why.
#[test]
fn gpu_attribute_and_multimodal_cache_plugins_are_refused_with_the_reason() {
    let dir = scratch_dir("tool");
    for (name, yaml, reason) in [
        (
            "gpu.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n- type: dcgm-data-source\n  parameters: {port: 9400}\n",
            "DCGM",
        ),
        (
            "mm.yaml",
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: mm-embeddings-cache-producer\n",
            "multimodal embeddings",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, yaml).unwrap();
        let out = render(&path);
        assert!(!out.status.success(), "{name} loaded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(".type") && err.contains(reason), "{name}: {err}");
    }
}
