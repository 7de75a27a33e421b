//! `GET /system_info`: what Judge0 shows, `lscpu`'s lines as key and value plus the totals of
//! `free -h`'s `Mem` and `Swap` rows. Collected once, when the API starts.

use serde_json::{Map, Value, json};

/// `lscpu` when the host has it (util-linux), else the main keys from `/proc/cpuinfo`; the
/// memory totals from `/proc/meminfo`.
pub fn collect() -> Value {
    let mut info = lscpu().unwrap_or_else(from_cpuinfo);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    info.insert("Mem".to_owned(), json!(human(kib(&meminfo, "MemTotal:"))));
    info.insert("Swap".to_owned(), json!(human(kib(&meminfo, "SwapTotal:"))));
    Value::Object(info)
}

fn lscpu() -> Option<Map<String, Value>> {
    let output = std::process::Command::new("lscpu")
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&output.stdout);
    let map: Map<String, Value> = text
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_owned(), json!(value.trim())))
        .filter(|(key, _)| !key.is_empty())
        .collect();
    (!map.is_empty()).then_some(map)
}

fn from_cpuinfo() -> Map<String, Value> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let first = |key: &str| {
        cpuinfo
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == key))
            .map(|(_, v)| v.trim().to_owned())
    };
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mut map = Map::new();
    map.insert("Architecture".into(), json!(std::env::consts::ARCH));
    map.insert("CPU(s)".into(), json!(cpus.to_string()));
    map.insert("Vendor ID".into(), json!(first("vendor_id")));
    map.insert("Model name".into(), json!(first("model name")));
    map.insert("CPU MHz".into(), json!(first("cpu MHz")));
    map
}

fn kib(meminfo: &str, key: &str) -> u64 {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `free -h`'s form: `23Gi`, `724Mi`, `0B`.
fn human(kib: u64) -> String {
    let gib = kib as f64 / (1024.0 * 1024.0);
    if kib == 0 {
        "0B".to_owned()
    } else if gib >= 1.0 {
        format!("{gib:.1}Gi")
    } else {
        format!("{}Mi", kib / 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_system_info_has_lscpu_keys_and_memory_totals() {
        let info = collect();
        for key in ["Architecture", "CPU(s)", "Mem", "Swap"] {
            assert!(info.get(key).is_some_and(Value::is_string), "{key}: {info}");
        }
        assert_eq!(human(0), "0B");
        assert_eq!(human(2 * 1024 * 1024), "2.0Gi");
        assert_eq!(human(724 * 1024), "724Mi");
    }
}
