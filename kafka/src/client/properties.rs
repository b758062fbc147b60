//! Kafka's client properties files, as Kafka's tools take them (`--command-config`,
//! `--producer.config`, `--consumer.config`): Java `.properties` syntax, Kafka client property
//! names.
//!
//! Syntax: [`ferry_core::properties`] (`java.util.Properties`, with the line of each key).
//!
//! Keys: the security properties of [`super::security`] are checked as the agent's options
//! are; `sasl.jaas.config` with Kafka's `PlainLoginModule` or `ScramLoginModule` gives
//! `sasl.username` and `sasl.password`; Java-only settings (trust and key stores) are refused
//! with what to use instead; any other key is handed to librdkafka, which must know it. Every
//! error names the file and the line, never a secret.

use std::path::{Path, PathBuf};

use ferry_core::properties::Property;
use rdkafka::ClientConfig;

use super::security::{
    OPTIONS, Secret, Security, SecurityOptions, java_only, option_of_property, property_of_option,
};

/// A problem in a properties file: the file, the line (when one is to blame) and what.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct PropertiesError {
    /// The file.
    pub file: PathBuf,
    /// The line, from 1.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// The client settings of a properties file, checked.
#[derive(Clone, Debug)]
pub struct ClientProperties {
    security: Security,
    /// Other librdkafka properties, in file order (none is a secret: those are refused).
    other: Vec<(String, String)>,
}

impl ClientProperties {
    /// Reads and checks the properties file at `path`.
    pub fn read(path: &Path) -> Result<Self, PropertiesError> {
        let text = std::fs::read_to_string(path).map_err(|e| PropertiesError {
            file: path.to_owned(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Checks the properties of `text`, read from `file`.
    pub fn parse(file: &Path, text: &str) -> Result<Self, PropertiesError> {
        let error = |line: Option<usize>, message: String| PropertiesError {
            file: file.to_owned(),
            line,
            message,
        };
        let mut options = SecurityOptions::default();
        // The line that set each security option, for the messages.
        let mut lines: Vec<(&'static str, usize)> = Vec::new();
        let mut other = Vec::new();
        for Property { key, value, line } in
            ferry_core::properties::parse(text).map_err(|e| error(Some(e.line), e.message))?
        {
            if let Some(why) = java_only(&key) {
                return Err(error(Some(line), format!("`{key}` {why}")));
            }
            if key == "sasl.jaas.config" {
                let (username, password) = parse_jaas(&value).map_err(|message| {
                    error(Some(line), format!("`sasl.jaas.config`: {message}"))
                })?;
                options.sasl_username = Some(username);
                options.sasl_password = Some(password);
                lines.push(("sasl_username", line));
                lines.push(("sasl_password", line));
                continue;
            }
            if let Some(option) = option_of_property(&key) {
                set_option(&mut options, option, value);
                lines.push((option, line));
                continue;
            }
            if key == "bootstrap.servers" {
                return Err(error(
                    Some(line),
                    "`bootstrap.servers`: give the servers with --bootstrap-server".into(),
                ));
            }
            // librdkafka checks the name and the value (without making a client).
            if let Err(e) = ClientConfig::new().set(&key, &value).create_native_config() {
                return Err(error(Some(line), format!("`{key}`: {e}")));
            }
            other.push((key, value));
        }
        let line_of = |option: &str| {
            lines
                .iter()
                .rev()
                .find(|(o, _)| *o == option)
                .map(|(_, line)| *line)
        };
        if options
            .sasl_mechanism
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("OAUTHBEARER"))
        {
            return Err(error(
                line_of("sasl_mechanism"),
                "`sasl.mechanism` OAUTHBEARER: the tools have no token to give (a static token \
                 is the agent's `sasl_oauthbearer_token` option; fetching tokens from an OIDC \
                 endpoint is not built in)"
                    .into(),
            ));
        }
        let security = Security::check(&options, |o| format!("`{}`", property_of_option(o)))
            .map_err(|p| error(line_of(p.option), p.message))?;
        Ok(Self { security, other })
    }

    /// The checked security settings.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// Sets every property of the file on `client`.
    pub fn apply(&self, client: &mut ClientConfig) {
        self.security.apply(client);
        for (key, value) in &self.other {
            client.set(key, value);
        }
    }
}

fn set_option(options: &mut SecurityOptions, option: &str, value: String) {
    let path = || Some(PathBuf::from(&value));
    match option {
        "security_protocol" => options.security_protocol = Some(value),
        "sasl_mechanism" => options.sasl_mechanism = Some(value),
        "sasl_username" => options.sasl_username = Some(value),
        "sasl_password" => options.sasl_password = Some(Secret::new(value)),
        "ssl_ca_location" => options.ssl_ca_location = path(),
        "ssl_certificate_location" => options.ssl_certificate_location = path(),
        "ssl_key_location" => options.ssl_key_location = path(),
        "ssl_key_password" => options.ssl_key_password = Some(Secret::new(value)),
        "ssl_endpoint_identification" => options.ssl_endpoint_identification = Some(value),
        _ => debug_assert!(
            OPTIONS.iter().all(|(o, _)| *o != option),
            "option {option} has no property"
        ),
    }
}

/// User name and password of a `sasl.jaas.config` of Kafka's PLAIN or SCRAM login module:
/// `org.apache.kafka.common.security.plain.PlainLoginModule required username="u"
/// password="p";`. Errors never quote the text (it holds the password).
fn parse_jaas(text: &str) -> Result<(String, Secret), String> {
    const MODULES: [&str; 2] = [
        "org.apache.kafka.common.security.plain.PlainLoginModule",
        "org.apache.kafka.common.security.scram.ScramLoginModule",
    ];
    let mut tokens = JaasTokens { rest: text.trim() };
    let module = tokens.word().ok_or("expected a login module class")?;
    if !MODULES.contains(&module) {
        return Err(format!(
            "login module `{module}` is not supported: use {} or {}",
            MODULES[0], MODULES[1]
        ));
    }
    match tokens.word() {
        Some("required" | "requisite" | "sufficient" | "optional") => {}
        _ => return Err("expected `required` after the login module".into()),
    }
    let (mut username, mut password) = (None, None);
    loop {
        tokens.skip_blanks();
        if tokens.rest.starts_with(';') {
            tokens.rest = &tokens.rest[1..];
            break;
        }
        let name = tokens
            .word()
            .ok_or("expected `name=\"value\"` or the closing `;`")?;
        tokens.skip_blanks();
        if !tokens.rest.starts_with('=') {
            return Err(format!("expected `=` after `{name}`"));
        }
        tokens.rest = &tokens.rest[1..];
        let value = tokens
            .value()
            .ok_or_else(|| format!("the value of `{name}` is not closed"))?;
        match name {
            "username" => username = Some(value),
            "password" => password = Some(Secret::new(value)),
            other => return Err(format!("option `{other}` is not supported")),
        }
    }
    tokens.skip_blanks();
    if !tokens.rest.is_empty() {
        return Err("more than one login module".into());
    }
    match (username, password) {
        (Some(username), Some(password)) => Ok((username, password)),
        (None, _) => Err("no `username`".into()),
        (_, None) => Err("no `password`".into()),
    }
}

struct JaasTokens<'a> {
    rest: &'a str,
}

impl<'a> JaasTokens<'a> {
    fn skip_blanks(&mut self) {
        self.rest = self.rest.trim_start();
    }

    /// A run of characters up to a blank, `=` or `;`.
    fn word(&mut self) -> Option<&'a str> {
        self.skip_blanks();
        let end = self
            .rest
            .find(|c: char| c.is_whitespace() || c == '=' || c == ';')
            .unwrap_or(self.rest.len());
        let (word, rest) = self.rest.split_at(end);
        self.rest = rest;
        (!word.is_empty()).then_some(word)
    }

    /// A `"quoted"` value (`\` escapes the next character) or a bare word.
    fn value(&mut self) -> Option<String> {
        self.skip_blanks();
        let Some(quoted) = self.rest.strip_prefix('"') else {
            return self.word().map(str::to_owned);
        };
        let mut out = String::new();
        let mut chars = quoted.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &quoted[i + 1..];
                    return Some(out);
                }
                '\\' => out.push(chars.next()?.1),
                c => out.push(c),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaas_configs_of_plain_and_scram_give_user_and_password() {
        let (user, password) = parse_jaas(
            r#"org.apache.kafka.common.security.plain.PlainLoginModule required username="api-key" password="s3\"cret";"#,
        )
        .unwrap();
        assert_eq!((user.as_str(), password.expose()), ("api-key", "s3\"cret"));
        let (user, password) = parse_jaas(
            "org.apache.kafka.common.security.scram.ScramLoginModule required\n username=alice\n password=\"p w\" ;",
        )
        .unwrap();
        assert_eq!((user.as_str(), password.expose()), ("alice", "p w"));
        for (text, message) in [
            (
                "com.sun.security.auth.module.Krb5LoginModule required;",
                "not supported",
            ),
            (
                "org.apache.kafka.common.security.plain.PlainLoginModule username=\"u\";",
                "expected `required`",
            ),
            (
                "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"hunter2",
                "not closed",
            ),
            (
                "org.apache.kafka.common.security.plain.PlainLoginModule required password=\"hunter2\";",
                "no `username`",
            ),
            (
                "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" tokenauth=\"true\" password=\"hunter2\";",
                "`tokenauth` is not supported",
            ),
        ] {
            let err = parse_jaas(text).unwrap_err();
            assert!(err.contains(message), "{text}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    fn check(text: &str) -> Result<ClientProperties, PropertiesError> {
        ClientProperties::parse(Path::new("client.properties"), text)
    }

    fn applied(properties: &ClientProperties) -> Vec<(String, String)> {
        let mut client = ClientConfig::new();
        properties.apply(&mut client);
        crate::client::security::tests::properties(&client)
    }

    #[test]
    fn a_confluent_style_file_becomes_librdkafka_settings() {
        let properties = check(
            "security.protocol=SASL_SSL\n\
             sasl.mechanism=PLAIN\n\
             sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \\\n\
             \x20  required username=\"KEY\" password=\"SECRET\";\n\
             ssl.endpoint.identification.algorithm=https\n\
             client.id=ops\n",
        )
        .unwrap();
        let shown = format!("{properties:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        let mut client = ClientConfig::new();
        properties.apply(&mut client);
        assert_eq!(client.get("sasl.password"), Some("SECRET"));
        assert_eq!(
            applied(&properties),
            [
                ("client.id", "ops"),
                ("sasl.mechanism", "PLAIN"),
                // rust-rdkafka never shows a sensitive value, not even here.
                ("sasl.password", "[sanitized for safety]"),
                ("sasl.username", "KEY"),
                ("security.protocol", "sasl_ssl"),
                ("ssl.endpoint.identification.algorithm", "https"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_bad_line_is_named_with_the_file() {
        for (text, line, message) in [
            (
                "security.protocol=SSL\nssl.truststore.location=/x.jks",
                2,
                "`ssl.truststore.location` is a Java client setting",
            ),
            (
                "ssl.keystore.password=hunter2",
                1,
                "ssl.certificate.location",
            ),
            ("no.such.property=1", 1, "`no.such.property`: "),
            (
                "# c\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAN",
                3,
                "did you mean `PLAIN`",
            ),
            (
                "security.protocol=sasl_plaintext\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u",
                2,
                "needs `sasl.password`",
            ),
            (
                "sasl.password=hunter2",
                1,
                "`sasl.password` is set but no SASL",
            ),
            (
                "security.protocol=SSL\nssl.ca.location=/no/such.pem",
                2,
                "`ssl.ca.location`: cannot read /no/such.pem",
            ),
            (
                "security.protocol=sasl_ssl\nsasl.mechanism=OAUTHBEARER",
                2,
                "OAUTHBEARER",
            ),
            (
                "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required password=\"hunter2\";",
                1,
                "no `username`",
            ),
            ("bootstrap.servers=h:1", 1, "--bootstrap-server"),
        ] {
            let err = check(text).unwrap_err();
            let shown = err.to_string();
            assert_eq!(err.line, Some(line), "{text}: {shown}");
            assert!(
                shown.starts_with(&format!("client.properties:{line}: ")),
                "{shown}"
            );
            assert!(shown.contains(message), "{text}: {shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        let err = check("security.protocol=SASL_SSL").unwrap_err();
        assert_eq!(err.line, Some(1), "{err}");
        assert!(err.to_string().contains("needs `sasl.mechanism`"), "{err}");
    }
}
