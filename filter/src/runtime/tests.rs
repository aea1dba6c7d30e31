//! Configuration: defaults, good configurations, and errors that name the field and reason.

use super::*;
use crate::scheduler::Handler;
use wasm_bindgen_test::wasm_bindgen_test;

fn parse(text: &str) -> Result<Runtime, ConfigError> {
    load(text)
}

#[wasm_bindgen_test(unsupported = test)]
fn no_configuration_is_the_reference_default_profile_with_its_detector_as_a_filter() {
    for text in [
        "",
        "  ",
        "{}",
        r#"{"pool":{"endpoints":["127.0.0.1:8000"]}}"#,
    ] {
        let c = parse(text).unwrap();
        assert_eq!(c.resolved.profiles.len(), 1);
        let p = &c.resolved.profiles[0];
        assert_eq!(p.name, "default");
        let w: Vec<(&str, Option<f64>)> = p
            .plugins
            .iter()
            .map(|r| (r.plugin_ref.as_str(), r.weight))
            .collect();
        assert_eq!(
            w,
            vec![
                ("utilization-detector", None),
                ("queue-scorer", Some(2.0)),
                ("kv-cache-utilization-scorer", Some(2.0)),
                ("prefix-cache-scorer", Some(3.0)),
                ("max-score-picker", None),
            ],
            "{text}"
        );
        assert!(c.resolved.plugin("single-profile-handler").is_some());
        assert_eq!(c.resolved.saturation_detector, "utilization-detector");
        // Its filter role bounds a queue relative to the pool's mean too.
        assert_eq!(
            c.resolved
                .plugin("utilization-detector")
                .map(|p| p.parameters["queueDepthMeanFactor"].clone()),
            Some(serde_json::json!(2.0))
        );
        assert_eq!(c.resolved.data_sources.len(), 1);
        assert_eq!(c.resolved.parser, "openai-parser");
        let s = &c.scheduler;
        assert_eq!(s.profiles[0].scorers.len(), 3);
        assert_eq!(s.profiles[0].filters.len(), 1);
        assert!(s.prefix.is_some());
        assert!(matches!(s.handler, Handler::Single(_)));
    }
    assert_eq!(
        load("").unwrap().pool.max_request_body_bytes,
        4 * 1024 * 1024
    );
}

#[wasm_bindgen_test(unsupported = test)]
fn reads_endpoints_as_strings_or_objects() {
    let c = parse(
        r#"{"apiVersion":"inference.networking.x-k8s.io/v1alpha1","kind":"EndpointPickerConfig",
            "pool":{"name":"p","maxRequestBodyBytes":1000,
            "endpoints":["127.0.0.1:8001",{"address":"127.0.0.1:8002","labels":{"role":"decode"}}]}}"#,
    )
    .unwrap();
    assert_eq!(c.pool.name, "p");
    assert_eq!(c.pool.max_request_body_bytes, 1000);
    assert_eq!(c.pool.endpoints[1].address, "127.0.0.1:8002");
    assert_eq!(c.pool.endpoints[1].labels["role"], "decode");
}

#[wasm_bindgen_test(unsupported = test)]
fn idle_metric_series_expire_after_ten_minutes_unless_configured() {
    let c = parse(r#"{"pool":{"metricsEndpoint":{"port":9090}}}"#).unwrap();
    assert_eq!(c.pool.idle_series_ms(), 600_000);
    let c = parse(r#"{"pool":{"metricsEndpoint":{"port":9090,"idleSeriesSeconds":90}}}"#).unwrap();
    assert_eq!(c.pool.idle_series_ms(), 90_000);
    assert_eq!(parse("{}").unwrap().pool.idle_series_ms(), 600_000);
}

#[wasm_bindgen_test(unsupported = test)]
fn a_full_reference_style_configuration_loads() {
    let c = parse(
        r#"{
      "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
      "kind": "EndpointPickerConfig",
      "featureGates": ["flowControl"],
      "plugins": [
        {"type": "prefix-cache-scorer", "parameters": {"blockSizeTokens": 32, "lruCapacityPerServer": 1000, "autoTune": false}},
        {"type": "queue-scorer"},
        {"type": "kv-cache-utilization-scorer"},
        {"name": "sticky", "type": "prefix-cache-affinity-filter", "parameters": {"affinityThreshold": 0.9}},
        {"type": "weighted-random-picker", "parameters": {"maxNumOfEndpoints": 2}},
        {"type": "utilization-detector", "parameters": {"queueDepthThreshold": 10, "metricsStalenessThreshold": "500ms"}},
        {"type": "metrics-data-source", "parameters": {"refreshInterval": "100ms", "timeout": "2s"}},
        {"type": "core-metrics-extractor", "parameters": {"defaultEngine": "sglang"}}
      ],
      "schedulingProfiles": [
        {"name": "main", "plugins": [
          {"pluginRef": "sticky"},
          {"pluginRef": "queue-scorer", "weight": 2},
          {"pluginRef": "kv-cache-utilization-scorer", "weight": 1.5},
          {"pluginRef": "prefix-cache-scorer", "weight": 3},
          {"pluginRef": "weighted-random-picker"}
        ]}
      ],
      "saturationDetector": {"pluginRef": "utilization-detector"},
      "dataLayer": {"sources": [{"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}]},
      "flowControl": {"maxBytes": "1Gi", "maxRequests": "1k", "defaultRequestTTL": "30s",
        "priorityBands": [{"priority": 10, "maxBytes": "100M"}, {"priority": -1, "orderingPolicyRef": "fcfs-ordering-policy"}]},
      "pool": {"objectives": [{"name": "critical", "priority": 10}, {"name": "batch", "priority": -1}],
        "modelRewrites": [{"name": "canary", "modelName": "llama", "targets": [{"modelName": "llama-v1", "weight": 90}, {"modelName": "llama-v2", "weight": 10}]}],
        "discovery": {"cluster": "outbound|8000||vllm.default.svc.cluster.local"},
        "failOpen": true}
    }"#,
    )
    .unwrap();
    let s = &c.scheduler;
    assert_eq!(s.profiles[0].filters.len(), 1);
    assert_eq!(s.profiles[0].scorers[1].weight, 1.5);
    let p = s.prefix.clone().unwrap();
    assert_eq!(
        (p.block_size_tokens, p.lru_capacity_per_server, p.auto_tune),
        (32, 1000, false)
    );
    let fc = &c.flow.control;
    assert!(c.flow.enabled);
    assert_eq!(
        (fc.max_bytes, fc.max_requests, fc.default_ttl_ms),
        (1 << 30, 1000, 30_000)
    );
    assert!(fc.bands.iter().any(|b| b.max_bytes == 100_000_000));
    let dl = c.data_layer.clone();
    assert_eq!((dl.interval_ms, dl.timeout_ms), (100, 2000));
    assert_eq!(dl.mapping.default_engine, "sglang");
    assert_eq!(c.pool.priority(Some("batch")), -1);
    assert_eq!(c.pool.priority(Some("unknown")), 0);
    assert_eq!(c.pool.rewrite("llama", 0.5), Some(("canary", "llama-v1")));
    assert_eq!(c.pool.rewrite("llama", 0.95), Some(("canary", "llama-v2")));
    assert_eq!(c.pool.rewrite("other", 0.5), None);
    assert!(c.pool.fail_open);
    assert_eq!(c.pool.discovery.clone().unwrap().admin_cluster, "epp-admin");
}

#[wasm_bindgen_test(unsupported = test)]
fn defaulting_follows_the_reference() {
    // Plugins without profiles: a `default` profile with every filter/scorer/picker, weight
    // 1, and a max-score-picker added because none is declared.
    let c = parse(r#"{"plugins":[{"type":"queue-scorer"},{"type":"label-selector-filter","parameters":{"matchLabels":{"a":"b"}}}]}"#).unwrap();
    let refs: Vec<&str> = c.resolved.profiles[0]
        .plugins
        .iter()
        .map(|r| r.plugin_ref.as_str())
        .collect();
    assert_eq!(
        refs,
        ["queue-scorer", "label-selector-filter", "max-score-picker"]
    );
    let s = &c.scheduler;
    assert_eq!(s.profiles[0].scorers[0].weight, 1.0);
    assert!(s.prefix.is_none(), "no prefix plugin, no hashing");
    // A declared picker is used for a profile without one.
    let c = parse(
        r#"{"plugins":[{"type":"queue-scorer"},{"type":"random-picker"}],
        "schedulingProfiles":[{"name":"x","plugins":[{"pluginRef":"queue-scorer"}]}]}"#,
    )
    .unwrap();
    assert_eq!(
        c.resolved.profiles[0].plugins[1].plugin_ref,
        "random-picker"
    );
    // Flow control is read only with its gate.
    let c = parse(r#"{"flowControl":{"maxRequests":"10"}}"#).unwrap();
    assert!(!c.flow.enabled);
    assert_eq!(c.flow.control.max_requests, 0, "ignored without the gate");
    // `dataLayer.sources: []` disables collection.
    let c = parse(r#"{"dataLayer":{"sources":[]}}"#).unwrap();
    assert!(!c.data_layer.clone().enabled);
}

#[wasm_bindgen_test(unsupported = test)]
fn a_pd_configuration_builds_the_disagg_handler() {
    let c = parse(
        r#"{"plugins":[
          {"type":"prefill-endpoints-filter"},{"type":"decode-endpoints-filter"},
          {"type":"prefix-cache-scorer"},{"type":"queue-scorer"},{"type":"max-score-picker"},
          {"type":"prefix-based-pd-decider","parameters":{"nonCachedTokens":8}},
          {"type":"disagg-profile-handler","parameters":{"deciders":{"prefill":"prefix-based-pd-decider"}}}],
         "schedulingProfiles":[
          {"name":"prefill","plugins":[{"pluginRef":"prefill-endpoints-filter"},{"pluginRef":"queue-scorer"}]},
          {"name":"decode","plugins":[{"pluginRef":"decode-endpoints-filter"},{"pluginRef":"prefix-cache-scorer","weight":3},{"pluginRef":"queue-scorer"}]}]}"#,
    )
    .unwrap();
    let s = &c.scheduler;
    match &s.handler {
        Handler::Disagg(d) => {
            assert_eq!(
                (d.decode.as_str(), d.prefill.as_str()),
                ("decode", "prefill")
            );
            assert_eq!(
                d.decider,
                Some(crate::scheduler::handlers::pd::Decider::PrefixBased {
                    non_cached_tokens: 8,
                    prompt_tokens: 0
                })
            );
        }
        other => panic!("{other:?}"),
    }
}

#[wasm_bindgen_test(unsupported = test)]
fn errors_name_the_field_and_the_reason() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"pool":{"endpoints":["127.0.0.1"]}}"#,
            "pool.endpoints[0]",
            "not an `ip:port`",
        ),
        (
            r#"{"pool":{"endpoints":[1]}}"#,
            "pool.endpoints[0]",
            "must be",
        ),
        (
            r#"{"pool":{"endpoints":["1.2.3.4:5","1.2.3.4:5"]}}"#,
            "pool.endpoints[1]",
            "duplicate",
        ),
        (
            r#"{"pool":{"maxRequestBodyBytes":-1}}"#,
            "pool.maxRequestBodyBytes",
            "positive",
        ),
        (
            r#"{"pool":{"endpoint":[]}}"#,
            "pool.endpoint",
            "unknown field",
        ),
        (
            r#"{"pool":{"metricsEndpoint":{"port":70000}}}"#,
            "pool.metricsEndpoint.port",
            "port number",
        ),
        (
            r#"{"pool":{"metricsEndpoint":{"port":9090,"path":"metrics"}}}"#,
            "pool.metricsEndpoint.path",
            "start with `/`",
        ),
        (
            r#"{"pool":{"metricsEndpoint":{}}}"#,
            "pool.metricsEndpoint",
            "missing field `port`",
        ),
        (
            r#"{"pool":{"metricsEndpoint":{"port":9090,"idleSeriesSeconds":5}}}"#,
            "pool.metricsEndpoint.idleSeriesSeconds",
            "from 60 to 604800",
        ),
        (r#"{"kind":"Other"}"#, "kind", "EndpointPickerConfig"),
        (
            r#"{"apiVersion":"config.x-k8s.io/v1alpha1"}"#,
            "apiVersion",
            "inference.networking.x-k8s.io/v1alpha1",
        ),
        (r#"{"data":{}}"#, "data", "unknown field"),
        ("{", "", "not valid JSON"),
        (
            r#"{"plugins":[{"type":"queue-scorer"},{"type":"kv-cache-utilization-scorer"},{"type":"foo-scorer"}]}"#,
            "plugins[2].type",
            "unknown plugin type \"foo-scorer\"; known types: prefix-cache-affinity-filter",
        ),
        (
            r#"{"plugins":[{"name":"x"}]}"#,
            "plugins[0].type",
            "missing",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer","name":"a"},{"type":"random-picker","name":"a"}]}"#,
            "plugins[1].name",
            "duplicate plugin name \"a\"",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"schedulingProfiles":[{"name":"p","plugins":[{"pluginRef":"kv"}]}]}"#,
            "schedulingProfiles[0].plugins[0].pluginRef",
            "unknown pluginRef \"kv\"; declared plugins: queue-scorer",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"schedulingProfiles":[{"name":"p","plugins":[{"pluginRef":"queue-scorer","weight":-1}]}]}"#,
            "schedulingProfiles[0].plugins[0].weight",
            "out of range",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"schedulingProfiles":[{"name":"p","plugins":[{"pluginRef":"queue-scorer","weight":"high"}]}]}"#,
            "schedulingProfiles[0].plugins[0].weight",
            "must be a number",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"schedulingProfiles":[{"name":"p"},{"name":"p"}]}"#,
            "schedulingProfiles[1].name",
            "duplicate profile name",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"schedulingProfiles":[{"name":"a"},{"name":"b"}]}"#,
            "schedulingProfiles",
            "need a profile handler",
        ),
        (
            r#"{"plugins":[{"type":"random-picker"},{"type":"max-score-picker"}],"schedulingProfiles":[{"name":"a","plugins":[{"pluginRef":"random-picker"},{"pluginRef":"max-score-picker"}]}]}"#,
            "schedulingProfiles[0].plugins[1].pluginRef",
            "already has a picker",
        ),
        (
            r#"{"featureGates":["flowcontrol"]}"#,
            "featureGates[0]",
            "unknown feature gate \"flowcontrol\"",
        ),
        (
            r#"{"featureGates":["flowControl"],"flowControl":{"maxBytes":"10GB"}}"#,
            "flowControl.maxBytes",
            "unknown suffix",
        ),
        (
            r#"{"flowControl":{"maxRequests":"-5"}}"#,
            "flowControl.maxRequests",
            "non-negative",
        ),
        (
            r#"{"flowControl":{"defaultRequestTTL":"30"}}"#,
            "flowControl.defaultRequestTTL",
            "unit",
        ),
        (
            r#"{"flowControl":{"priorityBands":[{"priority":1},{"priority":1}]}}"#,
            "flowControl.priorityBands[1].priority",
            "duplicate priority 1",
        ),
        (
            r#"{"flowControl":{"priorityBands":[{"priority":1,"fairnessPolicyRef":"nope"}]}}"#,
            "flowControl.priorityBands[0].fairnessPolicyRef",
            "unknown pluginRef \"nope\"",
        ),
        (
            r#"{"saturationDetector":{"pluginRef":"x"}}"#,
            "saturationDetector.pluginRef",
            "unknown pluginRef",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"}],"saturationDetector":{"pluginRef":"queue-scorer"}}"#,
            "saturationDetector.pluginRef",
            "is not a saturation detector",
        ),
        (
            r#"{"dataLayer":{"sources":[{"pluginRef":"m"}]}}"#,
            "dataLayer.sources[0].pluginRef",
            "unknown pluginRef",
        ),
        (
            r#"{"plugins":[{"type":"prefix-cache-affinity-filter","parameters":{"affinityThreshold":1.5}}]}"#,
            "plugins[0].parameters.affinityThreshold",
            "at most 1.0",
        ),
        (
            r#"{"plugins":[{"type":"prefix-cache-affinity-filter","parameters":{"explorationProbability":2}}]}"#,
            "plugins[0].parameters.explorationProbability",
            "between 0 and 1",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer","parameters":{"x":1}}]}"#,
            "plugins[0].parameters.x",
            "takes no parameters",
        ),
        (
            r#"{"plugins":[{"type":"prefix-cache-scorer","parameters":{"blockSize":64}}]}"#,
            "plugins[0].parameters.blockSize",
            "blockSizeTokens",
        ),
        (
            r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"lruCapacityPerServer":0}}]}"#,
            "plugins[0].parameters.lruCapacityPerServer",
            "positive",
        ),
        (
            r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"rendezvousPriorBlocks":0}}]}"#,
            "plugins[0].parameters.rendezvousPriorBlocks",
            "positive",
        ),
        (
            r#"{"plugins":[{"type":"prefix-cache-scorer","parameters":{"rendezvousPriorChoices":5}}]}"#,
            "plugins[0].parameters.rendezvousPriorChoices",
            "at most 4",
        ),
        (
            r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"rendezvousPrior":"yes"}}]}"#,
            "plugins[0].parameters.rendezvousPrior",
            "true or false",
        ),
        (
            r#"{"plugins":[{"type":"approx-prefix-cache-producer","parameters":{"rendezvousPriorLoadWeights":1}}]}"#,
            "plugins[0].parameters.rendezvousPriorLoadWeights",
            "true or false",
        ),
        (
            r#"{"plugins":[{"type":"label-selector-filter","parameters":{"matchExpressions":[{"key":"a","operator":"Near"}]}}]}"#,
            "plugins[0].parameters.matchExpressions[0].operator",
            "unknown operator",
        ),
        (
            r#"{"plugins":[{"type":"metrics-data-source","parameters":{"refreshInterval":"fast"}}]}"#,
            "plugins[0].parameters.refreshInterval",
            "not a duration",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"},{"type":"disagg-profile-handler"}],"schedulingProfiles":[{"name":"decode","plugins":[{"pluginRef":"queue-scorer"}]}]}"#,
            "plugins[1].parameters",
            "named \"prefill\"",
        ),
        (
            r#"{"plugins":[{"type":"queue-scorer"},{"type":"single-profile-handler"},{"type":"random-picker"}],"schedulingProfiles":[{"name":"a"},{"name":"b"}]}"#,
            "plugins[1]",
            "exactly one profile",
        ),
        (
            r#"{"pool":{"modelRewrites":[{"modelName":"a","targets":[]}]}}"#,
            "pool.modelRewrites[0].targets",
            "at least one target",
        ),
        (
            r#"{"pool":{"objectives":[{"name":"a","priority":"high"}]}}"#,
            "pool.objectives[0].priority",
            "integer",
        ),
        (
            r#"{"pool":{"discovery":{}}}"#,
            "pool.discovery",
            "missing field `cluster`",
        ),
        (
            r#"{"plugins":[{"type":"core-metrics-extractor","parameters":{"engineConfigs":[{"name":"x","kvUsageSpec":"a{b!=c}"}]}}]}"#,
            "plugins[0].parameters.engineConfigs[0].kvUsageSpec",
            "only `=` matchers",
        ),
    ];
    for (text, path, reason) in cases {
        let Err(e) = parse(text) else {
            panic!("{text} was accepted")
        };
        assert_eq!(e.path, *path, "for {text}: {e}");
        assert!(e.reason.contains(reason), "for {text}: {}", e.reason);
        assert!(e.to_string().contains(path) && e.to_string().contains(reason));
    }
}

#[wasm_bindgen_test(unsupported = test)]
fn the_seeds_prefix_scorer_name_is_the_prefix_cache_scorer() {
    let c = parse(
        r#"{"plugins":[{"type":"prefix-scorer","parameters":{"blockSizeTokens":32,"autoTune":false}},
                      {"type":"max-score-picker"}],
            "schedulingProfiles":[{"name":"default","plugins":[
                {"pluginRef":"prefix-scorer","weight":2},{"pluginRef":"max-score-picker"}]}]}"#,
    )
    .unwrap();
    let s = &c.scheduler;
    assert_eq!(s.profiles[0].scorers.len(), 1);
    assert_eq!(s.profiles[0].scorers[0].weight, 2.0);
    let p = s.prefix.clone().expect("the prefix index is fed");
    assert_eq!(p.block_size_tokens, 32);
    let Err(e) =
        parse(r#"{"plugins":[{"type":"prefix-scorer","parameters":{"blocksizetokens":32}}]}"#)
    else {
        panic!("an unknown parameter was accepted")
    };
    assert!(e.path.contains("blocksizetokens"), "{e}");
}

#[wasm_bindgen_test(unsupported = test)]
fn a_declared_detector_is_not_put_in_the_auto_built_profile() {
    // Declared plugins without profiles: the default profile takes every filter, scorer
    // and picker, but a saturation detector declared for flow control stays out of it
    // (as the reference's defaulting leaves it out), even though it can act as a filter.
    let c = parse(
        r#"{"plugins":[{"type":"utilization-detector","parameters":{"queueDepthThreshold":3}},
                      {"type":"queue-scorer"}],
            "saturationDetector":{"pluginRef":"utilization-detector"}}"#,
    )
    .unwrap();
    let refs: Vec<&str> = c.resolved.profiles[0]
        .plugins
        .iter()
        .map(|r| r.plugin_ref.as_str())
        .collect();
    assert_eq!(refs, ["queue-scorer", "max-score-picker"]);
    assert!(c.scheduler.profiles[0].filters.is_empty());
    assert_eq!(c.resolved.saturation_detector, "utilization-detector");
}

#[wasm_bindgen_test(unsupported = test)]
fn the_static_usage_limit_policy_needs_no_declaration() {
    // Named without being declared, the reference's auto-registered policy applies with its
    // default threshold (1.0); declared, its threshold is read.
    let c = parse(
        r#"{"featureGates":["flowControl"],
            "flowControl":{"usageLimitPolicyPluginRef":"static-usage-limit-policy"}}"#,
    )
    .unwrap();
    assert_eq!(c.flow.control.ceiling, 1.0);
    let c = parse(
        r#"{"featureGates":["flowControl"],
            "plugins":[{"type":"static-usage-limit-policy","name":"limit","parameters":{"threshold":0.7}}],
            "flowControl":{"usageLimitPolicyPluginRef":"limit"}}"#,
    )
    .unwrap();
    assert_eq!(c.flow.control.ceiling, 0.7);
}
