//! Clear errors from the host: an unknown import names itself; a filter that refuses its
//! configuration shows why.

mod common;

use host_sim::{Sim, SimConfig};

/// A minimal module importing `env.proxy_teleport: () -> ()`, in the binary format.
fn module_with_unknown_import() -> Vec<u8> {
    let mut m = vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    m.extend([0x01, 0x04, 0x01, 0x60, 0x00, 0x00]); // type section: one func () -> ()
    let import: Vec<u8> = [
        vec![0x01, 0x03],
        b"env".to_vec(),
        vec![0x0e],
        b"proxy_teleport".to_vec(),
        vec![0x00, 0x00],
    ]
    .concat();
    m.push(0x02);
    m.push(import.len() as u8);
    m.extend(import);
    m
}

#[test]
fn an_unknown_import_names_itself() {
    let dir = std::env::temp_dir().join(format!("host-sim-unknown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("unknown.wasm");
    std::fs::write(&path, module_with_unknown_import()).unwrap();
    let mut cfg = SimConfig::new("");
    cfg.wasm = path;
    let err = Sim::new(cfg)
        .err()
        .expect("instantiation must fail")
        .to_string();
    assert!(err.contains("env.proxy_teleport"), "{err}");
    assert!(err.contains("does not implement"), "{err}");
}

#[test]
fn a_configuration_the_filter_refuses_fails_the_run_with_the_filters_reason() {
    let mut sim = Sim::new(SimConfig::new(
        r#"{"pool":{"endpoints":["not-an-address"]}}"#,
    ))
    .unwrap();
    let err = sim.run().unwrap_err().to_string();
    assert!(err.contains("on_configure returned false"), "{err}");
    assert!(err.contains("pool.endpoints[0]"), "{err}");
}

#[test]
fn a_missing_module_says_how_to_build_it() {
    let mut cfg = SimConfig::new("");
    cfg.wasm = "/nonexistent/epp_filter.wasm".into();
    let err = format!("{:#}", Sim::new(cfg).err().unwrap());
    assert!(err.contains("cargo build --release -p filter"), "{err}");
}
