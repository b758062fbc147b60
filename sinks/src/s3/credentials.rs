//! Credentials from the AWS profile file (`~/.aws/credentials`), which the object-store
//! client does not read itself.

use std::path::PathBuf;

use ferry_core::SinkError;

/// Keys found in a profile.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ProfileKeys {
    pub(super) access_key_id: String,
    pub(super) secret_access_key: String,
    pub(super) session_token: Option<String>,
}

/// Reads the keys of `profile` (default: `AWS_PROFILE`, else `default`) from
/// `AWS_SHARED_CREDENTIALS_FILE` or `~/.aws/credentials`. `Ok(None)` when there is no such
/// file or profile and none was asked for by name; an error when a profile named in the
/// configuration is missing or has no keys.
pub(super) fn from_profile(profile: Option<&str>) -> Result<Option<ProfileKeys>, SinkError> {
    let asked = profile.is_some();
    let profile = profile
        .map(str::to_owned)
        .or_else(|| std::env::var("AWS_PROFILE").ok())
        .unwrap_or_else(|| "default".to_owned());
    let path = match std::env::var_os("AWS_SHARED_CREDENTIALS_FILE") {
        Some(path) => PathBuf::from(path),
        None => match std::env::var_os("HOME") {
            Some(home) => PathBuf::from(home).join(".aws").join("credentials"),
            None => return Ok(None),
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !asked => return Ok(None),
        Err(e) => {
            return Err(SinkError::io(
                format!("reading the credentials file {}", path.display()),
                e,
            ));
        }
    };
    match parse(&text, &profile) {
        Some(keys) => Ok(Some(keys)),
        None if asked => Err(SinkError::Delivery(format!(
            "profile `{profile}` with aws_access_key_id and aws_secret_access_key is not in {}",
            path.display()
        ))),
        None => Ok(None),
    }
}

/// The keys of section `[profile]` of an INI credentials file.
fn parse(text: &str, profile: &str) -> Option<ProfileKeys> {
    let mut in_section = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let section = section.trim();
            in_section = section == profile || section.strip_prefix("profile ") == Some(profile);
            continue;
        }
        if !in_section {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().to_owned();
        match key.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => id = Some(value),
            "aws_secret_access_key" => secret = Some(value),
            "aws_session_token" | "aws_security_token" => token = Some(value),
            _ => {}
        }
    }
    Some(ProfileKeys {
        access_key_id: id?,
        secret_access_key: secret?,
        session_token: token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# comment
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret/default

[archive]
aws_access_key_id=AKIDARCHIVE
aws_secret_access_key=secret-archive
aws_session_token = token
[broken]
aws_access_key_id = only-the-id
";

    #[test]
    fn reads_the_named_section() {
        assert_eq!(
            parse(FILE, "default"),
            Some(ProfileKeys {
                access_key_id: "AKIDDEFAULT".into(),
                secret_access_key: "secret/default".into(),
                session_token: None,
            })
        );
        let archive = parse(FILE, "archive").unwrap();
        assert_eq!(archive.access_key_id, "AKIDARCHIVE");
        assert_eq!(archive.session_token.as_deref(), Some("token"));
    }

    #[test]
    fn a_missing_or_incomplete_profile_has_no_keys() {
        assert_eq!(parse(FILE, "nope"), None);
        assert_eq!(parse(FILE, "broken"), None);
    }
}
