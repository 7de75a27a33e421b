//! `airlock probe`: the host's KVM kind, checked against the host itself (/dev/kvm and the
//! loaded modules), and the microvm tier reported unavailable with what is missing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: failing loudly is the point"
)]

use std::path::Path;
use std::process::Command;

#[test]
fn test_probe_reports_kvm_kind_and_microvm_tier_reason() {
    let output = Command::new(env!("CARGO_BIN_EXE_airlock"))
        .arg("probe")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = |prefix: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{stdout}"))
            .to_owned()
    };
    let kvm = line("kvm:");
    let expected = if !Path::new("/dev/kvm").exists() {
        "none (/dev/kvm does not exist)"
    } else if Path::new("/sys/module/kvm_pvm").exists() {
        "PVM"
    } else if Path::new("/sys/module/kvm_intel").exists() {
        "hardware KVM (kvm_intel)"
    } else if Path::new("/sys/module/kvm_amd").exists() {
        "hardware KVM (kvm_amd)"
    } else {
        "none ("
    };
    assert!(kvm.contains(expected), "expected {expected:?} in {kvm:?}");
    let microvm = line("tier microvm");
    assert!(
        microvm.contains("unavailable: no runtime path starts the VMM's Linux guest"),
        "{microvm}"
    );
}
