//! Image references: `[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`, normalised as Docker does.

use std::fmt;

use crate::digest::Digest;

/// Docker Hub's name in references, and the host its registry API answers on.
pub const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";

/// A parsed reference. `tag` is `latest` when neither a tag nor a digest was given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `host[:port]`, e.g. `127.0.0.1:5000` or `docker.io`.
    pub registry: String,
    /// e.g. `library/debian` or `airlock/busybox`.
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

/// Why a reference was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error(
        "`{0}` is not an image reference: expected [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]"
    )]
    Malformed(String),
    #[error(
        "`{reference}`: invalid repository component `{component}` (lowercase letters, digits and `._-` between them)"
    )]
    Component {
        reference: String,
        component: String,
    },
    #[error(
        "`{reference}`: invalid tag `{tag}` (at most 128 of `A-Za-z0-9_.-`, not starting with `.` or `-`)"
    )]
    Tag { reference: String, tag: String },
    #[error("`{reference}`: invalid digest")]
    Digest {
        reference: String,
        #[source]
        source: crate::digest::DigestError,
    },
}

impl Reference {
    /// Parses and normalises (`debian` → `docker.io/library/debian:latest`).
    pub fn parse(text: &str) -> Result<Reference, ReferenceError> {
        let malformed = || ReferenceError::Malformed(text.to_owned());
        if text.is_empty()
            || text.len() > 4096
            || text.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(malformed());
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => {
                let digest = Digest::parse(digest).map_err(|source| ReferenceError::Digest {
                    reference: text.to_owned(),
                    source,
                })?;
                (rest, Some(digest))
            }
            None => (text, None),
        };
        // A tag is after the last `:` that follows the last `/` (a port has a `/` after it).
        let (name, tag) = match rest.rfind(':') {
            Some(colon) if !rest[colon..].contains('/') => {
                (&rest[..colon], Some(&rest[colon + 1..]))
            }
            _ => (rest, None),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), path.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let registry = if registry == "index.docker.io" {
            DOCKER_HUB.to_owned()
        } else {
            registry
        };
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        {
            return Err(malformed());
        }
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        for component in repository.split('/') {
            if !valid_component(component) {
                return Err(ReferenceError::Component {
                    reference: text.to_owned(),
                    component: component.to_owned(),
                });
            }
        }
        if let Some(tag) = tag {
            let first_ok = tag
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
            let valid = first_ok
                && tag.len() <= 128
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !valid {
                return Err(ReferenceError::Tag {
                    reference: text.to_owned(),
                    tag: tag.to_owned(),
                });
            }
        }
        let tag = match (tag, &digest) {
            (Some(tag), _) => Some(tag.to_owned()),
            (None, None) => Some("latest".to_owned()),
            (None, Some(_)) => None,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The host the registry API answers on (Docker Hub's differs from its name).
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What to ask the registry for: the digest when there is one, else the tag.
    pub fn manifest_selector(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(digest), _) => digest.to_string(),
            (None, Some(tag)) => tag.clone(),
            (None, None) => "latest".to_owned(),
        }
    }

    /// The name a pull of this reference is recorded under: `name:tag` when it has a tag,
    /// else `name@digest`.
    pub fn record_name(&self) -> String {
        match (&self.tag, &self.digest) {
            (Some(tag), _) => format!("{}:{tag}", self.name()),
            (None, Some(digest)) => format!("{}@{digest}", self.name()),
            (None, None) => format!("{}:latest", self.name()),
        }
    }

    /// Whether the registry host is this machine (plain HTTP allowed without `--insecure`).
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.registry)
    }
}

/// `localhost`, `127.0.0.0/8` or `[::1]`, with or without a port.
pub fn is_loopback_host(host_port: &str) -> bool {
    let host = match host_port.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 255
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || b"._-".contains(b))
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_reference_docker_hub_short_name_normalised() {
        let r = Reference::parse("debian").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/debian:latest");
        assert_eq!(r.api_host(), "registry-1.docker.io");
    }

    #[test]
    fn test_reference_registry_port_and_tag_split() {
        let r = Reference::parse("127.0.0.1:5000/airlock/busybox:1.36").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "airlock/busybox");
        assert_eq!(r.tag.as_deref(), Some("1.36"));
        assert!(r.is_loopback());
        let r = Reference::parse("localhost:5000/x").unwrap();
        assert_eq!(r.tag.as_deref(), Some("latest"));
    }

    #[test]
    fn test_reference_digest_only_has_no_tag() {
        let digest = Digest::of(b"m");
        let r = Reference::parse(&format!("example.com/a/b@{digest}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_selector(), digest.to_string());
        assert_eq!(r.record_name(), format!("example.com/a/b@{digest}"));
    }

    #[test]
    fn test_reference_bad_inputs_refused() {
        for bad in [
            "",
            "UPPER/case",
            "a//b",
            "a/b:",
            "a/b:-x",
            "a b",
            "reg.io/../x",
            "x@sha256:12",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
        assert!(!Reference::parse("example.com/x").unwrap().is_loopback());
    }
}
