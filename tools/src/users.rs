//! `agent users`: add, delete and list the SCRAM users of a cluster (as `kafka-configs.sh
//! --entity-type users --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=...]'`,
//! `--delete-config` and `--describe`), through the KIP-554 APIs AlterUserScramCredentials and
//! DescribeUserScramCredentials, which librdkafka's admin API does not offer for every version,
//! so the tool speaks the protocol itself (see [`super::wire`]).
//!
//! The password is salted here: the broker receives the salt, the iteration count and the
//! salted password, never the password. It is read from an environment variable
//! (`--password-env`) or standard input (`--password-stdin`), never from the command line,
//! where other users of the machine could read it.

use std::io::{BufRead, Write};

use anyhow::{Context, bail};
use clap::Args;
use ferry_broker::{Password, SaslMechanism, salt_password};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::wire::Connection;
use super::{ClusterArgs, runtime};

/// Kafka's default iterations for a new SCRAM credential (`kafka-configs.sh`: 4096).
const DEFAULT_ITERATIONS: i32 = 4096;

/// Flags of `agent users`.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).args(["add", "delete", "list"])))]
#[command(group(clap::ArgGroup::new("password").args(["password_env", "password_stdin"])))]
pub struct UsersArgs {
    #[command(flatten)]
    server: ClusterArgs,
    /// Add the user, or replace its credentials.
    #[arg(long, value_name = "USER", requires = "password")]
    add: Option<String>,
    /// Delete the user's credentials (of `--mechanism`, or all of them).
    #[arg(long, value_name = "USER")]
    delete: Option<String>,
    /// List every user with its mechanisms and iterations.
    #[arg(long)]
    list: bool,
    /// SCRAM-SHA-256 or SCRAM-SHA-512, comma-separated. Default: both for --add, every one the
    /// user has for --delete. Not with --list, which lists them all.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "MECHANISM",
        conflicts_with = "list"
    )]
    mechanism: Vec<String>,
    /// PBKDF2 iterations of a new credential (4096 to 16384); only with --add.
    #[arg(long, default_value_t = DEFAULT_ITERATIONS, conflicts_with_all = ["delete", "list"])]
    iterations: i32,
    /// The environment variable holding the password of --add.
    #[arg(long = "password-env", value_name = "VAR", conflicts_with_all = ["delete", "list"])]
    password_env: Option<String>,
    /// Read the password of --add from the first line of standard input.
    #[arg(long = "password-stdin", conflicts_with_all = ["delete", "list"])]
    password_stdin: bool,
}

/// Runs `agent users`.
pub fn run(args: UsersArgs) -> anyhow::Result<()> {
    let mechanisms = args
        .mechanism
        .iter()
        .map(|m| {
            SaslMechanism::from_name(m)
                .filter(|m| *m != SaslMechanism::Plain)
                .with_context(|| {
                    format!("unknown SCRAM mechanism `{m}`: use SCRAM-SHA-256 or SCRAM-SHA-512")
                })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let password = match &args.add {
        Some(_) => Some(read_password(&args)?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    let security = args.server.wire_only_security()?;
    runtime()?.block_on(async {
        let mut connection =
            Connection::bootstrap(&args.server.bootstrap_server, &security).await?;
        if let (Some(user), Some(password)) = (&args.add, &password) {
            let mechanisms = if mechanisms.is_empty() {
                vec![SaslMechanism::ScramSha256, SaslMechanism::ScramSha512]
            } else {
                mechanisms
            };
            add(
                &mut connection,
                user,
                password,
                &mechanisms,
                args.iterations,
            )
            .await?;
            writeln!(
                out,
                "Completed updating credentials of user {user}: {}",
                names(&mechanisms)
            )?;
        } else if let Some(user) = &args.delete {
            let deleted = delete(&mut connection, user, &mechanisms).await?;
            writeln!(
                out,
                "Completed deleting credentials of user {user}: {}",
                names(&deleted)
            )?;
        } else {
            for (user, credentials) in list(&mut connection, None).await? {
                let configs: Vec<String> = credentials
                    .iter()
                    .map(|(m, iterations)| format!("{m}=iterations={iterations}"))
                    .collect();
                writeln!(
                    out,
                    "SCRAM credential configs for user-principal '{user}' are {}",
                    configs.join(", ")
                )?;
            }
        }
        Ok(())
    })
}

fn names(mechanisms: &[SaslMechanism]) -> String {
    mechanisms
        .iter()
        .map(|m| m.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The password of `--add`, from the environment or the first line of standard input.
fn read_password(args: &UsersArgs) -> anyhow::Result<Password> {
    let text = if let Some(var) = &args.password_env {
        std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?
    } else if args.password_stdin {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .context("reading the password from standard input")?;
        line.trim_end_matches(['\r', '\n']).to_owned()
    } else {
        bail!("--add needs --password-env VAR or --password-stdin");
    };
    if text.is_empty() {
        bail!("the password is empty");
    }
    Ok(Password::new(text))
}

fn check(response: &AlterUserScramCredentialsResponse) -> anyhow::Result<()> {
    let failures: Vec<String> = response
        .results
        .iter()
        .filter_map(|r| {
            let error = ResponseError::try_from_code(r.error_code)?;
            let message = r.error_message.as_deref().unwrap_or_default();
            Some(format!("user {}: {error}: {message}", r.user))
        })
        .collect();
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("{}", failures.join("; "))
    }
}

async fn add(
    connection: &mut Connection,
    user: &str,
    password: &Password,
    mechanisms: &[SaslMechanism],
    iterations: i32,
) -> anyhow::Result<()> {
    let mut upsertions = Vec::new();
    for mechanism in mechanisms {
        let salted = salt_password(*mechanism, password.expose(), iterations)?;
        upsertions.push(
            ScramCredentialUpsertion::default()
                .with_name(StrBytes::from_string(user.to_owned()))
                .with_mechanism(salted.mechanism_type)
                .with_iterations(salted.iterations)
                .with_salt(salted.salt.into())
                .with_salted_password(salted.salted_password.into()),
        );
    }
    let request = AlterUserScramCredentialsRequest::default().with_upsertions(upsertions);
    let version = connection.version::<AlterUserScramCredentialsRequest>()?;
    check(&connection.call(version, &request).await?)
}

async fn delete(
    connection: &mut Connection,
    user: &str,
    mechanisms: &[SaslMechanism],
) -> anyhow::Result<Vec<SaslMechanism>> {
    let mechanisms = if mechanisms.is_empty() {
        let listed = list(connection, Some(user)).await?;
        listed
            .into_iter()
            .flat_map(|(_, credentials)| credentials.into_iter().map(|(m, _)| m))
            .collect()
    } else {
        mechanisms.to_vec()
    };
    let deletions = mechanisms
        .iter()
        .map(|m| {
            ScramCredentialDeletion::default()
                .with_name(StrBytes::from_string(user.to_owned()))
                .with_mechanism(scram_type(*m))
        })
        .collect();
    let request = AlterUserScramCredentialsRequest::default().with_deletions(deletions);
    let version = connection.version::<AlterUserScramCredentialsRequest>()?;
    check(&connection.call(version, &request).await?)?;
    Ok(mechanisms)
}

/// Kafka's id of a SCRAM mechanism in the KIP-554 APIs.
fn scram_type(mechanism: SaslMechanism) -> i8 {
    match mechanism {
        SaslMechanism::ScramSha512 => 2,
        _ => 1,
    }
}

fn mechanism_of(t: i8) -> Option<SaslMechanism> {
    match t {
        1 => Some(SaslMechanism::ScramSha256),
        2 => Some(SaslMechanism::ScramSha512),
        _ => None,
    }
}

/// Every user (or `user` only) with its mechanisms and iterations.
async fn list(
    connection: &mut Connection,
    user: Option<&str>,
) -> anyhow::Result<Vec<(String, Vec<(SaslMechanism, i32)>)>> {
    let request = DescribeUserScramCredentialsRequest::default().with_users(
        user.map(|u| vec![UserName::default().with_name(StrBytes::from_string(u.to_owned()))]),
    );
    let version = connection.version::<DescribeUserScramCredentialsRequest>()?;
    let response: DescribeUserScramCredentialsResponse = connection.call(version, &request).await?;
    if let Some(error) = ResponseError::try_from_code(response.error_code) {
        bail!(
            "cannot describe users: {error}: {}",
            response.error_message.as_deref().unwrap_or_default()
        );
    }
    let mut users = Vec::new();
    for result in response.results {
        if let Some(error) = ResponseError::try_from_code(result.error_code) {
            bail!(
                "user {}: {error}: {}",
                result.user,
                result.error_message.as_deref().unwrap_or_default()
            );
        }
        let credentials = result
            .credential_infos
            .iter()
            .filter_map(|c| Some((mechanism_of(c.mechanism)?, c.iterations)))
            .collect();
        users.push((result.user.to_string(), credentials));
    }
    Ok(users)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: UsersArgs,
    }

    fn parse(args: &[&str]) -> Result<UsersArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("users").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn add_needs_a_password_source_and_takes_none_on_the_command_line() {
        let b = ["--bootstrap-server", "127.0.0.1:9092"];
        assert!(parse(&[&b[..], &["--add", "alice"]].concat()).is_err());
        assert!(parse(&[&b[..], &["--add", "alice", "--password", "x"]].concat()).is_err());
        assert!(
            parse(
                &[
                    &b[..],
                    &["--add", "alice", "--password-env", "P", "--password-stdin"]
                ]
                .concat()
            )
            .is_err()
        );
        let args = parse(&[&b[..], &["--add", "alice", "--password-env", "P"]].concat()).unwrap();
        assert_eq!(args.password_env.as_deref(), Some("P"));
        assert!(parse(&[&b[..], &["--list", "--delete", "alice"]].concat()).is_err());
        assert!(parse(&["--list"]).is_err(), "no bootstrap server");
    }
}
