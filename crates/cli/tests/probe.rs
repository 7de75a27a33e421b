//! `airlock probe`: the host's KVM kind, checked against the host itself (/dev/kvm and the
//! loaded modules), and the microvm tier's availability: unavailable with the reason where the
//! host has no hardware KVM or no guest is configured.

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
    let guest = std::env::var_os("AIRLOCK_MICROVM_KERNEL").is_some()
        || std::env::var_os("AIRLOCK_MICROVM_SNAPSHOT").is_some();
    let reason = if !Path::new("/dev/kvm").exists() {
        Some("this host has no KVM")
    } else if Path::new("/sys/module/kvm_pvm").exists() {
        Some("this host's /dev/kvm is PVM, where a Linux guest needs a PVM-enabled guest kernel")
    } else if !guest {
        Some("no guest is configured: set AIRLOCK_MICROVM_KERNEL")
    } else {
        None
    };
    match reason {
        Some(reason) => assert!(
            microvm.contains(&format!("unavailable: {reason}")),
            "expected {reason:?} in {microvm:?}"
        ),
        None => assert!(!microvm.contains("unavailable"), "{microvm}"),
    }
}
