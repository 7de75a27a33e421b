//! Registry authentication: `WWW-Authenticate` challenges (Basic, Bearer with the token
//! protocol) and credentials from a Docker `config.json`.

use std::path::PathBuf;

use base64::Engine as _;

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Registry credentials (a user and a password or identity token).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub(crate) fn basic_header(&self) -> String {
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// Why credentials could not be read.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("Docker config `{path}` cannot be read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Docker config `{path}` is not valid JSON")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("Docker config `{path}`: the `auth` of `{host}` is not base64 of `user:password`")]
    Auth { path: PathBuf, host: String },
}

/// Parses a challenge: a scheme, then `key="value"` (or bare token) parameters.
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header
        .split_once(char::is_whitespace)
        .unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.trim().chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String =
            std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            break;
        }
        if chars.next() != Some('=') {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ','))
                .collect::<String>()
                .trim()
                .to_owned();
        }
        params.push((key.trim().to_ascii_lowercase(), value));
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        }),
        _ => None,
    }
}

/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker/config.json"))
}

/// The `auths` keys that may hold credentials for `registry` (as written in references).
fn config_keys(registry: &str) -> Vec<String> {
    let mut keys = vec![
        registry.to_owned(),
        format!("https://{registry}"),
        format!("http://{registry}"),
    ];
    if registry == crate::reference::DOCKER_HUB {
        keys.extend(
            [
                "https://index.docker.io/v1/",
                "index.docker.io",
                "registry-1.docker.io",
            ]
            .map(String::from),
        );
    }
    keys
}

/// Basic credentials for `registry` from the Docker config (`auths.<host>.auth`), if any.
/// Credential helpers (`credsStore`, `credHelpers`) are not run.
pub fn docker_config_credentials(registry: &str) -> Result<Option<Credentials>, AuthError> {
    match docker_config_path() {
        Some(path) => credentials_from(&path, registry),
        None => Ok(None),
    }
}

/// [`docker_config_credentials`] from the config file at `path`.
pub fn credentials_from(
    path: &std::path::Path,
    registry: &str,
) -> Result<Option<Credentials>, AuthError> {
    let path = path.to_path_buf();
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(AuthError::Read { path, source }),
    };
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        auth: Option<String>,
    }
    let config: Config = serde_json::from_slice(&text).map_err(|source| AuthError::Json {
        path: path.clone(),
        source,
    })?;
    for key in config_keys(registry) {
        let found = config
            .auths
            .iter()
            .find(|(k, _)| k.trim_end_matches('/') == key.trim_end_matches('/'));
        let Some((_, Entry { auth: Some(auth) })) = found else {
            continue;
        };
        let bad = || AuthError::Auth {
            path: path.clone(),
            host: registry.to_owned(),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad())?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
        let (user, password) = decoded.split_once(':').ok_or_else(bad)?;
        return Ok(Some(Credentials {
            user: user.to_owned(),
            password: password.to_owned(),
        }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_challenge_bearer_with_quoted_commas() {
        let challenge = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(
            challenge,
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Bearer service=x"), None);
        assert_eq!(parse_challenge("Negotiate"), None);
    }

    #[test]
    fn test_credentials_from_docker_config_matches_host_forms() {
        let dir = std::env::temp_dir().join(format!("airlock-dockercfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        std::fs::write(
            &path,
            format!(r#"{{"auths":{{"https://reg.example:5000/":{{"auth":"{auth}"}},"https://index.docker.io/v1/":{{"auth":"{auth}"}},"bad.example":{{"auth":"!!"}}}}}}"#),
        )
        .unwrap();
        let found = credentials_from(&path, "reg.example:5000")
            .unwrap()
            .unwrap();
        assert_eq!(
            (found.user.as_str(), found.password.as_str()),
            ("alice", "s3cret")
        );
        assert!(credentials_from(&path, "docker.io").unwrap().is_some());
        assert!(credentials_from(&path, "other.example").unwrap().is_none());
        assert!(matches!(
            credentials_from(&path, "bad.example"),
            Err(AuthError::Auth { .. })
        ));
        assert!(
            credentials_from(&dir.join("missing.json"), "reg.example:5000")
                .unwrap()
                .is_none()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn test_credentials_header_is_base64_pair() {
        let c = Credentials {
            user: "u".into(),
            password: "p:w".into(),
        };
        assert_eq!(c.basic_header(), "Basic dTpwOnc=");
        assert!(!format!("{c:?}").contains("p:w"));
    }
}
