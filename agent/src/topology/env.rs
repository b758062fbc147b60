//! Environment variables in a pipeline file: `${NAME}` (or `${NAME:-default}`) in a value is
//! replaced by the variable's value before the file is read.

use ferry_core::ConfigError;
use marked_yaml::Node;
use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};

use super::key_location;

/// Replaces `${NAME}` in every value (not in keys) by the environment variable `NAME`; `$${`
/// writes a literal `${`. This is how secrets (`sasl_password: ${KAFKA_PASSWORD}`) stay out of
/// pipeline files. An unset variable is an error at the value; no message shows a value.
pub(crate) fn substitute_env(node: &Node, errors: &mut Vec<ConfigError>) -> Node {
    substitute_env_with(node, &|name| std::env::var(name).ok(), errors)
}

fn substitute_env_with(
    node: &Node,
    lookup: &dyn Fn(&str) -> Option<String>,
    errors: &mut Vec<ConfigError>,
) -> Node {
    match node {
        Node::Scalar(scalar) if scalar.as_str().contains('$') => {
            match expand_env(scalar.as_str(), lookup) {
                Ok(text) => {
                    let mut expanded = MarkedScalarNode::new(*scalar.span(), text);
                    // A quoted value stays a string; a plain one may still be a number.
                    expanded.set_coerce(scalar.may_coerce());
                    Node::from(expanded)
                }
                Err(message) => {
                    errors.push(ConfigError::new(key_location(scalar), message));
                    node.clone()
                }
            }
        }
        Node::Scalar(_) => node.clone(),
        Node::Sequence(sequence) => {
            let items = sequence
                .iter()
                .map(|item| substitute_env_with(item, lookup, errors))
                .collect();
            Node::from(marked_yaml::types::MarkedSequenceNode::new(
                *sequence.span(),
                items,
            ))
        }
        Node::Mapping(mapping) => {
            let mut out = MarkedMappingNode::new_empty(*mapping.span());
            for (key, value) in mapping.iter() {
                out.insert(key.clone(), substitute_env_with(value, lookup, errors));
            }
            Node::from(out)
        }
    }
}

/// `text` with `${NAME}` replaced by `lookup(NAME)` and `$${` by `${`.
fn expand_env(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(literal) = after.strip_prefix("${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(reference) = after.strip_prefix('{') {
            let Some(end) = reference.find('}') else {
                return Err("`${` without its closing `}` (write `$${` for a literal `${`)".into());
            };
            let reference_text = &reference[..end];
            // `${NAME:-default}`: the default when NAME is unset or empty, as in the shell.
            let (name, default) = match reference_text.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (reference_text, None),
            };
            let valid =
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(format!(
                    "`${{{reference_text}}}` is not an environment variable reference (letters, digits, `_`, then optionally `:-default`)"
                ));
            }
            let value = match (lookup(name).filter(|v| !v.is_empty()), default) {
                (Some(value), _) => value,
                (None, Some(default)) => default.to_owned(),
                (None, None) => {
                    return Err(format!(
                        "environment variable `{name}` is not set (write `${{{name}:-default}}` for a default)"
                    ));
                }
            };
            out.push_str(&value);
            rest = &reference[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_variables_fill_values_and_an_unset_one_is_an_error_at_its_line() {
        let lookup = |name: &str| (name == "PASSWORD").then(|| "hunter2".to_owned());
        assert_eq!(
            expand_env("a ${PASSWORD} b $${PASSWORD} $5", &lookup).unwrap(),
            "a hunter2 b ${PASSWORD} $5"
        );
        assert!(
            expand_env("${MISSING}", &lookup)
                .unwrap_err()
                .contains("`MISSING` is not set")
        );
        assert!(
            expand_env("${PASS", &lookup)
                .unwrap_err()
                .contains("closing")
        );
        assert!(
            expand_env("${A-B}", &lookup)
                .unwrap_err()
                .contains("not an environment")
        );
        // Defaults, as the shell's `${NAME:-default}`: taken when unset or empty.
        assert_eq!(
            expand_env(
                "${PASSWORD:-x} ${PORT:-9092} ${EMPTY:-} ${HOST:-a:b}",
                &lookup
            )
            .unwrap(),
            "hunter2 9092  a:b"
        );

        let root = marked_yaml::parse_yaml(
            0,
            "sinks:\n  out:\n    sasl_password: ${PASSWORD}\n    list: [x, '${MISSING}']\n",
        )
        .unwrap();
        let mut errors = Vec::new();
        let node = substitute_env_with(&root, &lookup, &mut errors);
        let out = node.as_mapping().unwrap().get_mapping("sinks").unwrap();
        let out = out.get_mapping("out").unwrap();
        assert_eq!(out.get_scalar("sasl_password").unwrap().as_str(), "hunter2");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].location.map(|l| l.line), Some(4));
        assert!(!format!("{errors:?}").contains("hunter2"));
    }
}
