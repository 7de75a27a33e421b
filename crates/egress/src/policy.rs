//! The enforced form of an [`EgressPlan`]: validated once (an invalid plan never replaces a
//! valid one), then asked per connection and per request. Paths are matched after
//! normalization, so `%61` and `a` are one path and `%2F` or `..` never smuggle a segment.

use airlock_policy::egress::{
    ApprovalMode, EgressPlan, EgressRule, Endpoint, HostPattern, HttpRule, Injection, NetworkMode,
};

use crate::address::{Host, parse_host};
use crate::credentials::{Placeholders, Secrets};

/// The longest approval wait a plan may ask for (one day).
const MAX_APPROVAL_TIMEOUT_MS: u64 = 86_400_000;
/// The shortest placeholder accepted: it must be unguessable and never occur by chance.
const MIN_PLACEHOLDER_LEN: usize = 16;
const MAX_SECRET_LEN: usize = 8192;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("network mode `full` does not use the egress proxy")]
    FullMode,
    #[error("egress rule {index} has an empty name")]
    EmptyRuleName { index: usize },
    #[error("host pattern {pattern:?} ({context}) is invalid: {why}")]
    BadHostPattern {
        pattern: String,
        context: String,
        why: String,
    },
    #[error("egress rule {rule:?} has no ports, or port 0")]
    BadPorts { rule: String },
    #[error("method {method:?} in {context} is not an upper-case HTTP method")]
    BadMethod { method: String, context: String },
    #[error("path pattern {path:?} in {context} is invalid: {why}")]
    BadPathPattern {
        path: String,
        context: String,
        why: &'static str,
    },
    #[error("credential {name:?} appears twice")]
    DuplicateCredential { name: String },
    #[error("credential {name:?} has no secret value")]
    MissingSecret { name: String },
    #[error(
        "the secret of credential {name:?} is empty, longer than {MAX_SECRET_LEN} bytes, or has characters a header cannot carry"
    )]
    BadSecret { name: String },
    #[error("credential {name:?} has no placeholder")]
    MissingPlaceholder { name: String },
    #[error(
        "the placeholder of credential {name:?} must be at least {MIN_PLACEHOLDER_LEN} visible ASCII characters, distinct from every other placeholder and secret"
    )]
    BadPlaceholder { name: String },
    #[error("credential {name:?} injects into header {header:?}, which is not allowed")]
    BadInjectHeader { name: String, header: String },
    #[error("credential {name:?} has a Basic username with ':' or control characters")]
    BadBasicUsername { name: String },
    #[error("credential {name:?} has no endpoints")]
    NoEndpoints { name: String },
    #[error("credential {name:?} is bound to {host}:{port}, which no egress rule allows")]
    UncoveredEndpoint {
        name: String,
        host: String,
        port: u16,
    },
    #[error("approval timeout_ms must be between 1 and {MAX_APPROVAL_TIMEOUT_MS}")]
    BadApprovalTimeout,
    #[error(
        "egress rule {rule:?} has git ref {glob:?} in git_push_refs, which is not a full ref glob (refs/heads/NAME)"
    )]
    BadGitRef { rule: String, glob: String },
}

/// A credential with its secret and placeholder, as the proxy holds it.
#[derive(Clone)]
pub(crate) struct Credential {
    pub(crate) name: String,
    pub(crate) inject: Injection,
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) secret: String,
    pub(crate) placeholder: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("name", &self.name)
            .field("inject", &self.inject)
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// Whether this credential may be used for this request.
    pub(crate) fn bound_to(&self, host: &str, port: u16, method: &str, path: &str) -> bool {
        self.endpoints.iter().any(|endpoint| {
            endpoint.port == port
                && endpoint.host.matches(host)
                && http_rule_allows(&endpoint.http, method, path)
        })
    }
}

/// One validated generation of the plan.
#[derive(Debug)]
pub(crate) struct Policy {
    pub(crate) generation: u64,
    pub(crate) mode: NetworkMode,
    pub(crate) rules: Vec<EgressRule>,
    pub(crate) credentials: Vec<Credential>,
    pub(crate) approvals: ApprovalMode,
}

/// A CONNECT (or first contact with a destination) that a rule allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnectAllowed {
    pub(crate) rule: String,
    /// The proxy must see the requests: a matching rule has L7 rules, or a credential is bound.
    pub(crate) inspect: bool,
}

impl Policy {
    pub(crate) fn compile(
        plan: &EgressPlan,
        secrets: &Secrets,
        placeholders: &Placeholders,
        generation: u64,
    ) -> Result<Self, PolicyError> {
        if plan.mode == NetworkMode::Full {
            return Err(PolicyError::FullMode);
        }
        for (index, rule) in plan.rules.iter().enumerate() {
            validate_rule(index, rule)?;
        }
        let mut credentials: Vec<Credential> = Vec::new();
        for plan_credential in &plan.credentials {
            let name = &plan_credential.name;
            if credentials.iter().any(|c| &c.name == name) {
                return Err(PolicyError::DuplicateCredential { name: name.clone() });
            }
            let secret = secrets
                .get(name)
                .ok_or_else(|| PolicyError::MissingSecret { name: name.clone() })?;
            if secret.is_empty()
                || secret.len() > MAX_SECRET_LEN
                || !secret.bytes().all(|b| (0x20..0x7f).contains(&b))
            {
                return Err(PolicyError::BadSecret { name: name.clone() });
            }
            let placeholder = placeholders
                .get(name)
                .ok_or_else(|| PolicyError::MissingPlaceholder { name: name.clone() })?;
            validate_injection(name, &plan_credential.inject)?;
            if plan_credential.endpoints.is_empty() {
                return Err(PolicyError::NoEndpoints { name: name.clone() });
            }
            for endpoint in &plan_credential.endpoints {
                validate_endpoint(name, endpoint, &plan.rules)?;
            }
            credentials.push(Credential {
                name: name.clone(),
                inject: plan_credential.inject.clone(),
                endpoints: plan_credential.endpoints.clone(),
                secret: secret.to_owned(),
                placeholder: placeholder.clone(),
            });
        }
        validate_placeholders(&credentials)?;
        if let ApprovalMode::Ask { timeout_ms } = plan.approvals
            && !(1..=MAX_APPROVAL_TIMEOUT_MS).contains(&timeout_ms)
        {
            return Err(PolicyError::BadApprovalTimeout);
        }
        Ok(Self {
            generation,
            mode: plan.mode,
            rules: plan.rules.clone(),
            credentials,
            approvals: plan.approvals,
        })
    }

    fn matching_rules<'a, 'h>(
        &'a self,
        host: &'h str,
        port: u16,
    ) -> impl Iterator<Item = &'a EgressRule> + use<'a, 'h> {
        let enabled = self.mode == NetworkMode::Proxy;
        self.rules
            .iter()
            .filter(move |rule| enabled && rule.ports.contains(&port) && rule.host.matches(host))
    }

    /// Whether some credential may be injected at this destination.
    pub(crate) fn credential_bound(&self, host: &str, port: u16) -> bool {
        self.credentials.iter().any(|credential| {
            credential
                .endpoints
                .iter()
                .any(|endpoint| endpoint.port == port && endpoint.host.matches(host))
        })
    }

    /// Whether some rule limits the git pushes to this destination (then its pushes are read).
    pub(crate) fn git_guarded(&self, host: &str, port: u16) -> bool {
        self.matching_rules(host, port)
            .any(|rule| rule.git_push_refs.is_some())
    }

    /// Whether the proxy must see the requests to this destination whatever the rules' L7
    /// parts say: a credential is bound there, or its git pushes are limited.
    pub(crate) fn must_inspect(&self, host: &str, port: u16) -> bool {
        self.credential_bound(host, port) || self.git_guarded(host, port)
    }

    /// The ref globs a git push with this method and (normalized) path may change: the union
    /// over the rules that limit pushes and allow the request. Empty when none does.
    pub(crate) fn git_push_refs(
        &self,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
    ) -> Vec<&str> {
        self.matching_rules(host, port)
            .filter(|rule| {
                rule.http.is_empty() || rule.http.iter().any(|h| http_rule_allows(h, method, path))
            })
            .filter_map(|rule| rule.git_push_refs.as_ref())
            .flatten()
            .map(String::as_str)
            .collect()
    }

    /// The decision for a tunnel to `host:port`, or `None` when no rule allows it.
    pub(crate) fn connect_decision(&self, host: &str, port: u16) -> Option<ConnectAllowed> {
        let matching: Vec<&EgressRule> = self.matching_rules(host, port).collect();
        let unrestricted = matching.iter().find(|rule| rule.http.is_empty());
        let rule = unrestricted.or(matching.first())?;
        Some(ConnectAllowed {
            rule: rule.name.clone(),
            inspect: unrestricted.is_none() || self.must_inspect(host, port),
        })
    }

    /// The rule that allows this request (`path` normalized), if any.
    pub(crate) fn request_rule(
        &self,
        host: &str,
        port: u16,
        method: &str,
        path: &str,
    ) -> Option<&str> {
        self.matching_rules(host, port)
            .find(|rule| {
                rule.http.is_empty() || rule.http.iter().any(|h| http_rule_allows(h, method, path))
            })
            .map(|rule| rule.name.as_str())
    }

    /// Every secret and placeholder, for redaction.
    pub(crate) fn sensitive_strings(&self) -> Vec<String> {
        self.credentials
            .iter()
            .flat_map(|c| [c.secret.clone(), c.placeholder.clone()])
            .collect()
    }
}

fn validate_host_pattern(pattern: &HostPattern, context: &str) -> Result<(), PolicyError> {
    let bad = |why: &str| PolicyError::BadHostPattern {
        pattern: pattern.0.clone(),
        context: context.to_owned(),
        why: why.to_owned(),
    };
    let (exact, wildcard) = match pattern.0.strip_prefix("*.") {
        Some(suffix) => (suffix, true),
        None => (pattern.0.as_str(), false),
    };
    if exact.contains('*') {
        return Err(bad("`*` may only start the pattern, as `*.`"));
    }
    match parse_host(exact) {
        Ok(Host::Name(name)) if name == exact => {
            if wildcard && !name.contains('.') {
                return Err(bad(
                    "a wildcard must sit below a registrable name, not a TLD",
                ));
            }
            Ok(())
        }
        Ok(Host::Ip(ip)) if !wildcard && ip.to_string() == exact => Ok(()),
        Ok(_) => Err(bad(
            "write names in lower case without a trailing dot, addresses in standard notation",
        )),
        Err(error) => Err(bad(&error.to_string())),
    }
}

fn validate_rule(index: usize, rule: &EgressRule) -> Result<(), PolicyError> {
    if rule.name.trim().is_empty() {
        return Err(PolicyError::EmptyRuleName { index });
    }
    let context = format!("egress rule {:?}", rule.name);
    validate_host_pattern(&rule.host, &context)?;
    if rule.ports.is_empty() || rule.ports.contains(&0) {
        return Err(PolicyError::BadPorts {
            rule: rule.name.clone(),
        });
    }
    for http in &rule.http {
        validate_http_rule(http, &context)?;
    }
    for glob in rule.git_push_refs.iter().flatten() {
        if airlock_policy::net::check_git_ref_glob(glob).is_err() {
            return Err(PolicyError::BadGitRef {
                rule: rule.name.clone(),
                glob: glob.clone(),
            });
        }
    }
    Ok(())
}

fn validate_http_rule(rule: &HttpRule, context: &str) -> Result<(), PolicyError> {
    for method in &rule.methods {
        if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(PolicyError::BadMethod {
                method: method.clone(),
                context: context.to_owned(),
            });
        }
    }
    for path in &rule.paths {
        let bad = |why| PolicyError::BadPathPattern {
            path: path.clone(),
            context: context.to_owned(),
            why,
        };
        if !path.starts_with('/') {
            return Err(bad("it must start with `/`"));
        }
        if path.contains(['?', '#', '%', '\\']) || path.chars().any(|c| c.is_control()) {
            return Err(bad(
                "it may not contain `?`, `#`, `%`, `\\` or control characters",
            ));
        }
        let segments: Vec<&str> = path[1..].split('/').collect();
        if segments.iter().any(|s| s.contains("**") && *s != "**") {
            return Err(bad("`**` must be a whole segment"));
        }
        if segments.iter().filter(|s| **s == "**").count() > 4 {
            return Err(bad("at most four `**` segments"));
        }
        if segments.iter().any(|s| *s == "." || *s == "..") {
            return Err(bad("`.` and `..` segments never match a normalized path"));
        }
    }
    Ok(())
}

fn validate_injection(name: &str, inject: &Injection) -> Result<(), PolicyError> {
    match inject {
        Injection::Header { name: header } => {
            const FORBIDDEN: &[&str] = &[
                "host",
                "connection",
                "content-length",
                "transfer-encoding",
                "upgrade",
                "te",
                "trailer",
                "keep-alive",
                "proxy-connection",
                "proxy-authorization",
            ];
            let lower = header.to_ascii_lowercase();
            if hyper::header::HeaderName::from_bytes(header.as_bytes()).is_err()
                || FORBIDDEN.contains(&lower.as_str())
            {
                return Err(PolicyError::BadInjectHeader {
                    name: name.to_owned(),
                    header: header.clone(),
                });
            }
        }
        Injection::Bearer => {}
        Injection::Basic { username } => {
            if username.contains(':') || username.chars().any(|c| c.is_control()) {
                return Err(PolicyError::BadBasicUsername {
                    name: name.to_owned(),
                });
            }
        }
    }
    Ok(())
}

fn validate_endpoint(
    name: &str,
    endpoint: &Endpoint,
    rules: &[EgressRule],
) -> Result<(), PolicyError> {
    let context = format!("credential {name:?}");
    validate_host_pattern(&endpoint.host, &context)?;
    validate_http_rule(&endpoint.http, &context)?;
    let covered = rules.iter().any(|rule| {
        rule.ports.contains(&endpoint.port)
            && (rule.host == endpoint.host
                || (!endpoint.host.0.starts_with("*.") && rule.host.matches(&endpoint.host.0)))
    });
    if endpoint.port == 0 || !covered {
        return Err(PolicyError::UncoveredEndpoint {
            name: name.to_owned(),
            host: endpoint.host.0.clone(),
            port: endpoint.port,
        });
    }
    Ok(())
}

fn validate_placeholders(credentials: &[Credential]) -> Result<(), PolicyError> {
    for credential in credentials {
        let placeholder = &credential.placeholder;
        let bad = || PolicyError::BadPlaceholder {
            name: credential.name.clone(),
        };
        if placeholder.len() < MIN_PLACEHOLDER_LEN
            || !placeholder.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(bad());
        }
        for other in credentials {
            if other.secret.contains(placeholder.as_str())
                || placeholder.contains(other.secret.as_str())
            {
                return Err(bad());
            }
            if other.name != credential.name
                && (other.placeholder.contains(placeholder.as_str())
                    || placeholder.contains(other.placeholder.as_str()))
            {
                return Err(bad());
            }
        }
    }
    Ok(())
}

/// Whether an L7 rule allows `method` on the normalized `path`.
pub(crate) fn http_rule_allows(rule: &HttpRule, method: &str, path: &str) -> bool {
    (rule.methods.is_empty() || rule.methods.iter().any(|m| m == method))
        && (rule.paths.is_empty() || rule.paths.iter().any(|p| path_matches(p, path)))
}

/// Glob match: `*` within one segment, `**` across any number of segments (zero included).
pub(crate) fn path_matches(pattern: &str, path: &str) -> bool {
    let pattern: Vec<&str> = pattern
        .strip_prefix('/')
        .unwrap_or(pattern)
        .split('/')
        .collect();
    let path: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    segments_match(&pattern, &path)
}

fn segments_match(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| segments_match(rest, &path[skip..])),
        Some((first, rest)) => match path.split_first() {
            Some((segment, path_rest)) => {
                segment_matches(first.as_bytes(), segment.as_bytes())
                    && segments_match(rest, path_rest)
            }
            None => false,
        },
    }
}

/// `*` matches any run of bytes inside a segment.
fn segment_matches(glob: &[u8], text: &[u8]) -> bool {
    let (mut g, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        if g < glob.len() && glob[g] == b'*' {
            backtrack = Some((g, t));
            g += 1;
        } else if g < glob.len() && glob[g] == text[t] {
            g += 1;
            t += 1;
        } else if let Some((star, matched)) = backtrack {
            g = star + 1;
            t = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    glob[g..].iter().all(|b| *b == b'*')
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("the request path must start with `/`")]
    NotAbsolute,
    #[error("the request path has a bad percent escape")]
    BadEscape,
    #[error("the request path encodes `/`, `\\`, or a control character")]
    EncodedSeparator,
    #[error("the request path has a `.` or `..` segment")]
    DotSegment,
    #[error("the request path is not UTF-8 once decoded")]
    NotUtf8,
}

/// The path rules see: percent-decoded, with no encoded separator and no dot segment.
pub(crate) fn normalize_path(raw: &str) -> Result<String, PathError> {
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if raw.contains('\\') {
        return Err(PathError::EncodedSeparator);
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%' {
            let hex = bytes
                .get(index + 1..index + 3)
                .ok_or(PathError::BadEscape)?;
            let text = std::str::from_utf8(hex).map_err(|_| PathError::BadEscape)?;
            let value = u8::from_str_radix(text, 16).map_err(|_| PathError::BadEscape)?;
            if value == b'/' || value == b'\\' || value < 0x20 || value == 0x7f {
                return Err(PathError::EncodedSeparator);
            }
            decoded.push(value);
            index += 3;
        } else {
            decoded.push(byte);
            index += 1;
        }
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::NotUtf8)?;
    if decoded[1..].split('/').any(|s| s == "." || s == "..") {
        return Err(PathError::DotSegment);
    }
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_path_globs() {
        assert!(path_matches("/repos/acme/**", "/repos/acme"));
        assert!(path_matches("/repos/acme/**", "/repos/acme/x/y/z"));
        assert!(!path_matches("/repos/acme/**", "/repos/acmex/y"));
        assert!(path_matches("/repos/*/pulls", "/repos/acme/pulls"));
        assert!(!path_matches("/repos/*/pulls", "/repos/a/b/pulls"));
        assert!(path_matches("/v1/*.json", "/v1/data.json"));
        assert!(!path_matches("/v1/*.json", "/v1/data.txt"));
        assert!(path_matches("/**", "/"));
        assert!(path_matches("/a/**/z", "/a/z"));
        assert!(path_matches("/a/**/z", "/a/b/c/z"));
        assert!(!path_matches("/a", "/a/"));
    }

    #[test]
    fn test_paths_are_normalized_or_refused() {
        assert_eq!(normalize_path("/repos/%61cme"), Ok("/repos/acme".into()));
        assert_eq!(normalize_path("/a%2Fb"), Err(PathError::EncodedSeparator));
        assert_eq!(normalize_path("/a%2fb"), Err(PathError::EncodedSeparator));
        assert_eq!(normalize_path("/a/../b"), Err(PathError::DotSegment));
        assert_eq!(normalize_path("/a/%2e%2e/b"), Err(PathError::DotSegment));
        assert_eq!(normalize_path("/a/%2"), Err(PathError::BadEscape));
        assert_eq!(normalize_path("*"), Err(PathError::NotAbsolute));
        assert_eq!(normalize_path("/a\\b"), Err(PathError::EncodedSeparator));
    }
}
