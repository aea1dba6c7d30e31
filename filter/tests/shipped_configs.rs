//! Every filter configuration the project ships in `envoy/config/` loads: a user who
//! passes one to `scripts/run --config` or into a WasmPlugin gets what its name says,
//! not a load-time error.

use std::path::PathBuf;

#[test]
fn every_shipped_configuration_loads() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../envoy/config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("envoy/config")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 8, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        if let Err(e) = epp_filter::runtime::load(&text) {
            panic!("{}: {e:?}", file.display());
        }
    }
}

#[test]
fn the_slo_routing_configuration_has_its_two_profiles() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../envoy/config");
    let text = std::fs::read_to_string(dir.join("slo-routing.json")).expect("readable");
    let rt = epp_filter::runtime::load(&text).expect("loads");
    assert!(
        rt.scheduler.latency.is_some(),
        "the predictor is configured"
    );
    let names: Vec<&str> = rt
        .scheduler
        .profiles
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["default", "slo"]);
}
