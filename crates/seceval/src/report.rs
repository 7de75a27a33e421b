//! The scorecard (text), the results as JSON, and docs/seceval.md generated from the catalog.

use std::fmt::Write as _;
use std::io::{self, Write};

use serde::Serialize;

use super::catalog::{Ablate, Case, Catalog, ControlAt, Pattern, Via};
use super::runner::{BWRAP_ARGS, Verdict};

#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    pub id: String,
    pub group: String,
    pub layers: Vec<String>,
    pub expected: String,
    pub airlock: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bwrap: Option<Verdict>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl CaseResult {
    pub fn new(
        case: &Case,
        airlock: Verdict,
        bwrap: Option<Verdict>,
        notes: Vec<String>,
    ) -> CaseResult {
        CaseResult {
            id: case.id.clone(),
            group: case.group.clone(),
            layers: case.expect.layers.clone(),
            expected: case.expect.outcome.clone(),
            airlock,
            bwrap,
            notes,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TierResults {
    pub tier: String,
    pub cases: Vec<CaseResult>,
}

/// Every case n/a for `reason` (a tier this build or host cannot run).
pub fn all_not_applicable(cases: &[&Case], reason: &str) -> Vec<CaseResult> {
    cases
        .iter()
        .map(|case| {
            let verdict = Verdict::NotApplicable {
                reason: reason.to_owned(),
            };
            CaseResult::new(case, verdict, None, Vec::new())
        })
        .collect()
}

#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Totals {
    pub blocked: usize,
    pub allowed: usize,
    pub known_gaps: usize,
    pub wrong_layer: usize,
    pub not_applicable: usize,
}

impl Totals {
    fn of<'a>(verdicts: impl Iterator<Item = &'a Verdict>) -> Totals {
        let mut totals = Totals::default();
        for verdict in verdicts {
            match verdict {
                Verdict::Blocked { .. } => totals.blocked += 1,
                Verdict::Allowed { .. } => totals.allowed += 1,
                Verdict::KnownGap { .. } => totals.known_gaps += 1,
                Verdict::WrongLayer { .. } => totals.wrong_layer += 1,
                Verdict::NotApplicable { .. } => totals.not_applicable += 1,
            }
        }
        totals
    }

    fn line(&self) -> String {
        format!(
            "{} blocked, {} allowed, {} known gap{}, {} wrong layer, {} n/a",
            self.blocked,
            self.allowed,
            self.known_gaps,
            if self.known_gaps == 1 { "" } else { "s" },
            self.wrong_layer,
            self.not_applicable
        )
    }
}

/// The scorecard: per group and per case, then totals for each tier (and the baseline).
pub fn scorecard(
    out: &mut impl Write,
    catalog: &Catalog,
    tiers: &[TierResults],
    baseline: bool,
) -> io::Result<()> {
    for tier in tiers {
        let baseline = baseline && tier.cases.iter().any(|c| c.bwrap.is_some());
        if tier
            .cases
            .iter()
            .all(|c| matches!(c.airlock, Verdict::NotApplicable { .. }))
            && let Some(Verdict::NotApplicable { reason }) = tier.cases.first().map(|c| &c.airlock)
        {
            writeln!(
                out,
                "tier {}: n/a ({reason}) for all {} cases",
                tier.tier,
                tier.cases.len()
            )?;
            continue;
        }
        writeln!(
            out,
            "airlock seceval: tier {}, {} cases{}",
            tier.tier,
            tier.cases.len(),
            if baseline { ", beside bwrap" } else { "" }
        )?;
        let mut groups: Vec<&str> = Vec::new();
        for case in &tier.cases {
            if !groups.contains(&case.group.as_str()) {
                groups.push(&case.group);
            }
        }
        for group in groups {
            let cases: Vec<&CaseResult> = tier.cases.iter().filter(|c| c.group == group).collect();
            writeln!(out)?;
            writeln!(out, "{}", catalog.group_title(group))?;
            for case in &cases {
                let airlock = case.airlock.label();
                match &case.bwrap {
                    Some(bwrap) => {
                        writeln!(out, "  {:<36} {:<46} {}", case.id, airlock, bwrap.label())?
                    }
                    None => writeln!(out, "  {:<36} {}", case.id, airlock)?,
                }
                for note in &case.notes {
                    writeln!(out, "  {:<36} note: {note}", "")?;
                }
            }
            let totals = Totals::of(cases.iter().map(|c| &c.airlock));
            write!(out, "  = {}", totals.line())?;
            if baseline {
                let bwrap = Totals::of(cases.iter().filter_map(|c| c.bwrap.as_ref()));
                write!(
                    out,
                    " | bwrap: {} blocked, {} allowed, {} n/a",
                    bwrap.blocked, bwrap.allowed, bwrap.not_applicable
                )?;
            }
            writeln!(out)?;
        }
        let totals = Totals::of(tier.cases.iter().map(|c| &c.airlock));
        writeln!(out)?;
        writeln!(out, "total, airlock {}: {}", tier.tier, totals.line())?;
        if baseline {
            let bwrap = Totals::of(tier.cases.iter().filter_map(|c| c.bwrap.as_ref()));
            writeln!(
                out,
                "total, bwrap {}: {} blocked, {} allowed, {} n/a",
                BWRAP_ARGS.join(" "),
                bwrap.blocked,
                bwrap.allowed,
                bwrap.not_applicable
            )?;
        }
    }
    let failed = tiers
        .iter()
        .flat_map(|t| &t.cases)
        .filter(|c| c.airlock.fails())
        .count();
    let gaps = tiers
        .iter()
        .flat_map(|t| &t.cases)
        .filter(|c| matches!(c.airlock, Verdict::KnownGap { .. }))
        .count();
    writeln!(
        out,
        "result: {}",
        if failed == 0 {
            format!(
                "PASS (no case meant to be blocked was allowed; {gaps} known gap(s), SECURITY.md)"
            )
        } else {
            format!("FAIL ({failed} case(s) allowed or stopped by the wrong layer)")
        }
    )?;
    Ok(())
}

pub fn json(tiers: &[TierResults]) -> serde_json::Value {
    let tiers: Vec<serde_json::Value> = tiers
        .iter()
        .map(|tier| {
            serde_json::json!({
                "tier": tier.tier,
                "totals": Totals::of(tier.cases.iter().map(|c| &c.airlock)),
                "bwrap_totals": tier.cases.iter().any(|c| c.bwrap.is_some())
                    .then(|| Totals::of(tier.cases.iter().filter_map(|c| c.bwrap.as_ref()))),
                "cases": tier.cases,
            })
        })
        .collect();
    serde_json::json!({ "tiers": tiers })
}

fn proof_text(case: &Case) -> String {
    let mut parts = Vec::new();
    for proof in &case.proofs {
        let what = match (proof.ablate.as_slice(), &proof.probe) {
            ([Ablate::SeccompTag], _) => "filter answers tagged".to_owned(),
            ([], Some(probe)) => format!("evidence `{}`", probe.join(" ")),
            (ablate, probe) => {
                let mut text = format!(
                    "without {}",
                    ablate
                        .iter()
                        .map(|a| a.flag())
                        .collect::<Vec<_>>()
                        .join(" and ")
                );
                if let Some(probe) = probe {
                    let _ = write!(text, ", `{}`", probe.join(" "));
                }
                text
            }
        };
        parts.push(format!("{what}: `{}`", proof.outcome));
    }
    if let Some(control) = &case.control {
        let at = match control.at {
            ControlAt::Host => "host",
            ControlAt::FakeClient => "fake-internet client",
        };
        parts.push(format!("control on the {at}: `{}`", control.outcome));
    }
    if parts.is_empty() {
        "the outcome alone names the layer".into()
    } else {
        parts.join("; ")
    }
}

/// What a case expects on another tier, for the catalog's table.
fn tier_text(on: &Case) -> String {
    if let Some(reason) = &on.na {
        return format!("n/a: {reason}");
    }
    if let Some(reason) = &on.known_gap {
        return format!("known gap: {reason}");
    }
    let layers: Vec<String> = on.expect.layers.iter().map(|l| format!("`{l}`")).collect();
    format!(
        "{} `{}`; {}",
        layers.join(" + "),
        on.expect.outcome,
        proof_text(on)
    )
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// docs/seceval.md, from the catalog alone (so that it never depends on a run).
pub fn markdown(catalog: &Catalog) -> String {
    let mut md = String::new();
    md.push_str(INTRO);
    md.push_str("\n## Layers\n\n| Layer | What it is | How a case proves this layer stopped it |\n|---|---|---|\n");
    for layer in &catalog.layers {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} |",
            layer.id,
            cell(&layer.title),
            cell(&layer.attribution)
        );
    }
    let _ = writeln!(md, "\n## The catalog ({} cases)\n", catalog.cases.len());
    md.push_str("Expected outcomes use the runner's vocabulary: `errno NAME`, `killed SIGNAL`, `http STATUS`, `ok=TEXT` (the probe succeeded and saw exactly TEXT), `ok~TEXT` (saw something containing TEXT), `ok!~TEXT` (saw nothing containing TEXT). Item numbers refer to the research catalog (`policy-and-security.md` §(d)).\n");
    for group in &catalog.groups {
        let _ = writeln!(md, "\n### {} (§(d) {})\n", group.title, group.section);
        md.push_str("| Case | Attack | Expected layer | Expected errno | How the layer is proven | Source (§(d) items) |\n|---|---|---|---|---|---|\n");
        for case in catalog.cases.iter().filter(|c| c.group == group.id) {
            let errno = Pattern::parse(&case.expect.outcome)
                .map(|p| p.errno_text())
                .unwrap_or_default();
            let mut attack = case.title.clone();
            match case.via {
                Via::Run => {}
                Via::Daemon => attack.push_str(" (in a daemon's sandbox)"),
                Via::Scenario => attack.push_str(" (against the daemon, from the host)"),
                Via::Vmm => attack.push_str(" (the VMM, read from the host)"),
            }
            if let Some(reason) = &case.na {
                let _ = write!(attack, " **n/a: {reason}**");
            }
            if let Some(reason) = &case.known_gap {
                let _ = write!(attack, " **known gap: {reason}**");
            }
            let mut proven = proof_text(case);
            let blocks = [
                (&case.container, airlock_api::Tier::Container, "Container"),
                (&case.microvm, airlock_api::Tier::Microvm, "Microvm"),
            ];
            for (_, tier, name) in blocks.into_iter().filter(|(block, ..)| block.is_some()) {
                let on = case.on_tier(tier);
                let _ = write!(proven, ". **{name} tier:** {}", tier_text(&on));
            }
            let refs: Vec<String> = case.refs.iter().map(u32::to_string).collect();
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {} | {} | {} ({}) |",
                case.id,
                cell(&attack),
                case.expect
                    .layers
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(" + "),
                cell(&errno),
                cell(&proven),
                cell(&case.source),
                refs.join(", ")
            );
        }
    }
    md
}

const INTRO: &str = r#"# Security evaluation: `airlock seceval`

<!-- Generated by `airlock seceval --markdown` from crates/seceval/catalog.json.
     Do not edit by hand: a test in crates/seceval/src/report.rs fails when this file drifts. -->

`airlock seceval` runs a catalog of real attacks against Airlock, each from inside a sandbox by
`airlock-probe`, and checks not only that each attack failed but **which layer stopped it**. A
regression in defence in depth (say, Landlock no longer covering a path because the mount view
happens to cover it too) therefore shows up even while another layer still holds.

```sh
airlock seceval [--tier process|container|microvm|all] [--policy FILE] [--json OUT] [--baseline bwrap] [--only PREFIX]
```

It needs root (cgroups, network namespaces, fixtures under `/home` and `/run`) and the
`airlock-probe` binary beside `airlock`. The scorecard lists, per group and per case,
`blocked(layer)`, `ALLOWED`, `WRONG LAYER` or `n/a (reason)`, then totals. It exits non-zero if
any case meant to be blocked was allowed, or was stopped by another layer than the catalog names.
A **known gap** (a weakness SECURITY.md documents under the case's id) is shown red as
`ALLOWED, known gap`, counted separately, and does not fail the run; a case passing only
because this kernel lacks the feature (no module loading, no `/proc/kcore`) is never counted as
blocked: it must prove Airlock's own layer, or it is reported n/a with the reason. On the
microvm tier the guest kernel is one of Airlock's layers (`guest-kernel`): the project builds it
without those features, so a case it answers ENOSYS, EAFNOSUPPORT or SIGSEGV there is blocked by
it (the built configuration names the option; no proof run can take it away from inside).

## How a case proves its layer

Each case names the outcome it expects inside the sandbox (an errno, a signal, or what a
successful probe observed) and the layers that produce it. Then one or more of:

- **The outcome alone**, where only one layer can produce it: `EROFS` comes only from the
  read-only mount view, `ENETUNREACH` for 169.254.169.254 only from the empty network
  namespace, `SIGSYS` only from the seccomp filter's architecture check.
- **Seccomp tagging.** The proof run installs the same filter, but every rule that answers
  `EPERM` answers `EHWPOISON` (133) instead, which none of the filtered syscalls returns on its
  own. Seeing 133 proves the filter answered, even where the kernel would have said `EPERM`
  anyway (no capability) or `ENOSYS` (no module support on this kernel).
- **Ablation.** The proof run takes one layer away (Landlock, the seccomp rules, the masks or
  the cgroup limits) and the outcome must change as the catalog says: to success if that layer
  was the only one, or to the next layer's errno. Where two layers hold (a credential is both
  masked and outside Landlock's read rules), each is taken away alone and then both.
- **Evidence.** A second probe in the same sandbox shows the layer's mark, such as the mode-000
  node a mask puts over a secret.
- **Control.** The same attack outside any sandbox (on the host, or in the client namespace of
  the fake internet) succeeds, so the attack is real here. If the control fails too and nothing
  else proves Airlock's layer, the case is n/a ("passes trivially").

### The evaluation-only knobs

Ablation and tagging need the runtime to build a sandbox with a layer missing. That is
`airlock_runtime::Runtime::run_for_evaluation` with an `Ablation` (Landlock, Seccomp,
SeccompTag, Masks, Cgroup), reached only through the hidden `airlock __seceval-run` command that
`airlock seceval` spawns for its proof runs. `airlock run`, `Runtime::start` and airlockd always
send the default (every layer on): the daemon's API carries a `SandboxConfig`, which has no
field for it. The knobs only ever remove confinement that the caller, who is trusted by the
threat model, chose to remove, and every normal attempt of the suite runs with all layers.
Landlock's and the tag's switches travel in the helper's spec (`spec::Evaluation`); the others
change the compiled plan before it is sent.

## Fake remote targets

No packet leaves the machine. The suite creates, and removes afterwards:

- sinks on the host: a loopback TCP listener (IPv4 and IPv6), a loopback UDP echo server, an
  abstract Unix socket, pathname sockets in `/run`, in the host's `/tmp` and in a world-writable
  scratch directory, and a TCP listener on the host's own address;
- the **fake internet**: two network namespaces joined by a veth pair and nothing else. One
  holds a metadata server at 169.254.169.254 and fd00:ec2::254, a DNS server at 10.53.0.53 that
  answers every name, and an exfiltration sink at 198.51.100.7:443 (all served by
  `airlock-probe fake-servers`, which logs every connection and query); the other has a route to
  them and runs the controls. A case marked `silent` fails if any sink saw anything during the
  sandboxed attempt;
- for `network: proxy` cases, a test upstream on the host's loopback that counts the bytes it
  receives. The egress proxy of those sandboxes resolves only `allowed.test` and `other.test`
  (to that upstream) and `rebind.test` (to 169.254.169.254, as a rebinding DNS server would);
  any other name fails instead of reaching real DNS;
- fake home directories with world-readable credentials (so that file modes are not what
  protects them), a set-uid root copy of the probe in a host workspace only root can reach on
  the host, and a daemon (`airlock serve` on loopback,
  with its own state directory) with three sandboxes.

## The container tier

`--tier container` (and `all`) runs the whole catalog again with every `airlock run` in a
container-tier sandbox of a test image the suite builds (one layer: the static probe at
`/usr/bin/airlock-probe`, an `/etc/passwd`, `/etc/group` and `/usr/bin/env`, and no
`/etc/shadow`), unless the case names another (`{hostileimage}` adds a layer of symbolic
links where Airlock mounts its filesystems). Where the tier changes what stops an attack, the
case says so (its `container` entry, shown as **Container tier** below): a host path is not
hidden by a mask there but absent (`ENOENT`, with a control showing the host has it, and
unchanged with Landlock and the masks taken away); a write to the image's own files succeeds
and lands in the sandbox's upper directory, never in the shared layer directory (checked after
the attempt); `/proc` is read-only (`EROFS`), since Landlock grants writes on the whole root;
and the process tier's host-socket gap does not exist. Cases through the daemon run there too:
the suite imports the same image into its daemon's store (`POST /v1/images/import`) and creates
the daemon's three sandboxes with `image`, so the daemon's state directory, a host credential
behind a planted symlink and `/etc/shadow` are absent from them (`ENOENT`, or the file API's
404) rather than masked.

## Baseline

`--baseline bwrap` runs each `airlock run` case, where meaningful, inside
`bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc` and prints a second column: blocked
(with bwrap's outcome) or allowed. Cases that need Airlock's daemon, a host workspace or a policy
are n/a there. Run as root, as the suite is, bwrap keeps uid 0 and a full capability set inside
its user namespace.
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_api::Tier;

    #[test]
    fn test_docs_seceval_md_is_generated_from_the_catalog() {
        let catalog = Catalog::shipped().unwrap();
        let generated = markdown(&catalog);
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/seceval.md");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/seceval.md is out of date: run `airlock seceval --markdown > docs/seceval.md`"
        );
    }

    #[test]
    fn test_every_known_gap_is_named_in_security_md() {
        let catalog = Catalog::shipped().unwrap();
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../SECURITY.md");
        let security = std::fs::read_to_string(path).unwrap();
        let tiers = [Tier::Process, Tier::Container, Tier::Microvm];
        for case in &catalog.cases {
            for tier in tiers {
                if case.on_tier(tier).known_gap.is_some() {
                    assert!(
                        security.contains(&format!("`{}`", case.id)),
                        "SECURITY.md does not name the known gap `{}` ({tier:?})",
                        case.id
                    );
                }
            }
        }
    }
}
