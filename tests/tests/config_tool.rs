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
