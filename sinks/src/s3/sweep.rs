//! Abandoned multipart uploads of the sink, aborted at start.
//!
//! The uploader records a multipart upload's id in the progress record before it sends parts
//! (and aborts it after a crash), but a crash between CreateMultipartUpload and that record
//! leaves an upload nobody knows of: it holds storage until a lifecycle rule removes it. At
//! start, before the uploader runs, the sink lists the bucket's multipart uploads in progress
//! (ListMultipartUploads) under the constant start of its keys, and aborts every one whose key
//! has the shape of its own (`<file_prefix><sink>.<first>-<last><file_suffix>`) and whose id
//! the progress record does not hold (those the uploader resumes or aborts itself).
//!
//! object_store has no call for ListMultipartUploads. The request is signed by object_store
//! all the same, as a presigned URL ([`Signer::signed_url_opts`] with the listing's query):
//! the same credentials (keys, profile, role, session token), region, endpoint and addressing
//! as every other request of the sink, and no signing code of ours. The aborts go through
//! object_store's [`MultipartStore::abort_multipart`].
//!
//! A sweep that fails (the store down, a refused listing) is a warning naming the sink and the
//! bucket; the sink runs on, and the next start sweeps again.

use std::collections::HashSet;
use std::time::Duration;

use object_store::aws::AmazonS3;
use object_store::multipart::MultipartStore;
use object_store::path::Path as ObjectPath;
use object_store::signer::{Method, SignedUrlOptions, Signer};
use serde::Deserialize;

use super::Uploader;
use crate::roll::PathTemplate;

/// How long a signed listing URL is valid: one request, sent at once.
const URL_VALIDITY: Duration = Duration::from_secs(300);
/// Pages of 1000 uploads listed at most in one sweep (a guard against a store whose markers
/// do not advance).
const MAX_PAGES: usize = 1000;

/// Which keys are this sink's: the shape of the keys [`crate::roll::Roller`] gives objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SinkKeys {
    /// Every key of the sink starts with this (as stored; empty or ending in `/`): the
    /// directories of the templates before their first escape.
    prefix: String,
    /// The sink's name as stored.
    sink: String,
    /// `file_suffix` as stored.
    suffix: String,
    /// What stands between `prefix` and the sink's name.
    head: Head,
}

/// What stands between the listing prefix and the sink's name in a key of the sink.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Head {
    /// Exactly this: `path` and `file_prefix` have no escapes.
    Exact(String),
    /// Directories, then this at the start of the file name: `file_prefix` has no escapes.
    FileName(String),
    /// Anything: `file_prefix` has escapes (whose values may hold anything, `/` too).
    Any,
}

impl SinkKeys {
    /// The keys of sink `sink` with these templates.
    pub(super) fn new(
        path: &PathTemplate,
        file_prefix: &PathTemplate,
        file_suffix: &str,
        sink: &str,
    ) -> Self {
        // Where an object goes is `path`, a `/` unless it is empty or ends in one, then
        // `file_prefix` (as `Roller::place` renders it).
        let mut constant = path.literal_prefix().to_owned();
        if path.is_constant() {
            if !constant.is_empty() && !constant.ends_with('/') {
                constant.push('/');
            }
            constant.push_str(file_prefix.literal_prefix());
        }
        let directories = constant.rsplit_once('/').map_or("", |(dirs, _)| dirs);
        let prefix = stored_directories(directories);
        let head = if !file_prefix.is_constant() {
            Head::Any
        } else if path.is_constant() {
            // The whole place is `constant`: its file-name part follows `prefix`.
            let name = constant.rsplit('/').next().unwrap_or_default();
            Head::Exact(stored_fragment(name))
        } else {
            let name = file_prefix.literal_prefix().rsplit('/').next();
            Head::FileName(stored_fragment(name.unwrap_or_default()))
        };
        Self {
            prefix,
            sink: stored_fragment(sink),
            suffix: stored_fragment(file_suffix),
            head,
        }
    }

    /// Whether `key` has the shape of a key of this sink.
    fn holds(&self, key: &str) -> bool {
        let Some(rest) = key
            .strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_suffix(&self.suffix))
        else {
            return false;
        };
        // `<first>-<last>`: channel sequence numbers (20 digits each), or `<opened ms>-<staging
        // id>` (13 and 10 digits at least).
        let Some((named, range)) = rest.rsplit_once('.') else {
            return false;
        };
        let Some((first, last)) = range.split_once('-') else {
            return false;
        };
        let digits = |text: &str, least: usize| {
            (least..=20).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit())
        };
        if !digits(first, 13) || !digits(last, 10) {
            return false;
        }
        let Some(head) = named.strip_suffix(&self.sink) else {
            return false;
        };
        match &self.head {
            Head::Exact(expected) => head == expected,
            Head::FileName(expected) => head.rsplit('/').next() == Some(expected.as_str()),
            Head::Any => true,
        }
    }
}

/// `text` as the sink's keys hold it: `Roller::key` names an object by
/// `object_store::path::Path::from(..)` (empty segments dropped, characters S3 advises
/// against percent-encoded), which the uploader sends as it is.
fn stored(text: &str) -> String {
    ObjectPath::from(text).to_string()
}

/// Directories as the start of a stored key: empty, or ending in `/`.
fn stored_directories(directories: &str) -> String {
    let mut out = stored(directories);
    if !out.is_empty() {
        out.push('/');
    }
    out
}

/// Part of a file name (no `/`) as a stored key holds it. Characters are encoded one by one,
/// except a whole name of `.` or `..`, which a part of a longer name is not.
fn stored_fragment(text: &str) -> String {
    if text.is_empty() || text == "." || text == ".." {
        return text.to_owned();
    }
    // `Path::from` would drop a `/` (never in a name part the sink writes) as a separator.
    text.split('/').map(stored).collect::<Vec<_>>().join("/")
}

/// One page of ListMultipartUploads.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListMultipartUploadsResult {
    #[serde(default)]
    is_truncated: bool,
    #[serde(default)]
    next_key_marker: Option<String>,
    #[serde(default)]
    next_upload_id_marker: Option<String>,
    #[serde(default, rename = "Upload")]
    uploads: Vec<Upload>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Upload {
    key: String,
    upload_id: String,
}

/// An S3 error answer.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ErrorAnswer {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Aborts the multipart uploads of the sink that its progress record does not hold. Run
/// before the uploader starts (which records the uploads it begins). Never fails: a failure
/// is a warning.
pub(super) async fn abort_abandoned(uploader: &Uploader, keys: &SinkKeys, timeout: Duration) {
    let known: HashSet<String> = uploader
        .progress
        .get()
        .finished
        .into_iter()
        .filter_map(|f| f.upload_id)
        .collect();
    let listed = match list(&uploader.store, &keys.prefix, timeout).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::warn!(
                sink = uploader.sink,
                bucket = uploader.bucket,
                prefix = keys.prefix,
                error = %error,
                "could not list the bucket's multipart uploads to abort those an earlier run left behind (a lifecycle rule for incomplete uploads removes them); the sink runs on"
            );
            return;
        }
    };
    let mut aborted = 0;
    for upload in listed {
        if known.contains(&upload.upload_id) || !keys.holds(&upload.key) {
            continue;
        }
        // A key of the sink is a valid path; another one is not the sink's.
        let Ok(path) = ObjectPath::parse(&upload.key) else {
            continue;
        };
        match uploader
            .store
            .abort_multipart(&path, &upload.upload_id)
            .await
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                aborted += 1;
                tracing::info!(
                    sink = uploader.sink,
                    bucket = uploader.bucket,
                    key = upload.key,
                    upload_id = upload.upload_id,
                    "aborted a multipart upload an earlier run left behind"
                );
            }
            Err(error) => tracing::warn!(
                sink = uploader.sink,
                bucket = uploader.bucket,
                key = upload.key,
                error = %error,
                "could not abort a multipart upload an earlier run left behind (a lifecycle rule for incomplete uploads removes it)"
            ),
        }
    }
    if aborted > 0 {
        tracing::info!(
            sink = uploader.sink,
            bucket = uploader.bucket,
            aborted,
            "abandoned multipart uploads aborted"
        );
    }
}

/// The multipart uploads in progress under `prefix`, every page.
async fn list(store: &AmazonS3, prefix: &str, timeout: Duration) -> Result<Vec<Upload>, String> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("building an HTTP client: {e}"))?;
    let mut uploads = Vec::new();
    // The next page starts after these (key-marker, upload-id-marker).
    let mut markers: (Option<String>, Option<String>) = (None, None);
    for _ in 0..MAX_PAGES {
        let mut query = vec![("uploads", String::new()), ("prefix", prefix.to_owned())];
        if let Some(key) = &markers.0 {
            query.push(("key-marker", key.clone()));
        }
        if let Some(id) = &markers.1 {
            query.push(("upload-id-marker", id.clone()));
        }
        let url = store
            .signed_url_opts(
                Method::GET,
                &ObjectPath::ROOT,
                URL_VALIDITY,
                &SignedUrlOptions::new().with_query(query),
            )
            .await
            .map_err(|e| format!("signing ListMultipartUploads: {e}"))?;
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| format!("ListMultipartUploads: {e}"))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| format!("ListMultipartUploads: reading the answer: {e}"))?;
        if !status.is_success() {
            let answer: ErrorAnswer = quick_xml::de::from_str(&body).unwrap_or_default();
            return Err(format!(
                "ListMultipartUploads: {status} {} {}",
                answer.code, answer.message
            ));
        }
        let page: ListMultipartUploadsResult = quick_xml::de::from_str(&body)
            .map_err(|e| format!("ListMultipartUploads: an answer that is not a listing: {e}"))?;
        uploads.extend(page.uploads);
        if !page.is_truncated {
            return Ok(uploads);
        }
        // As boto3's paginator: the markers the page gives, those it leaves out not sent
        // (SeaweedFS gives only the upload id's, and pages by it).
        let given = |marker: Option<String>| marker.filter(|m| !m.is_empty());
        let next = (
            given(page.next_key_marker),
            given(page.next_upload_id_marker),
        );
        if next == (None, None) || next == markers {
            return Err("ListMultipartUploads: a truncated page without a next marker".into());
        }
        markers = next;
    }
    Err(format!("ListMultipartUploads: more than {MAX_PAGES} pages"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink_keys(path: &str, file_prefix: &str, suffix: &str, sink: &str) -> SinkKeys {
        SinkKeys::new(
            &PathTemplate::parse(path).unwrap(),
            &PathTemplate::parse(file_prefix).unwrap(),
            suffix,
            sink,
        )
    }

    const RANGE: &str = "00000000000000000001-00000000000000000200";
    const NO_SEQUENCE: &str = "1700000000000-0000000042";

    #[test]
    fn constant_templates_match_exactly() {
        let keys = sink_keys("logs/app", "", ".gz", "archive");
        assert_eq!(keys.prefix, "logs/app/");
        assert!(keys.holds(&format!("logs/app/archive.{RANGE}.gz")));
        assert!(keys.holds(&format!("logs/app/archive.{NO_SEQUENCE}.gz")));
        // Another sink, a name that ends like this one's, another suffix, another directory.
        assert!(!keys.holds(&format!("logs/app/other.{RANGE}.gz")));
        assert!(!keys.holds(&format!("logs/app/my-archive.{RANGE}.gz")));
        assert!(!keys.holds(&format!("logs/app/archive.{RANGE}.zst")));
        assert!(!keys.holds(&format!("logs/app/sub/archive.{RANGE}.gz")));
        assert!(!keys.holds(&format!("logs/other/archive.{RANGE}.gz")));
        // Not the sink's numbering.
        assert!(!keys.holds("logs/app/archive.1-2.gz"));
        assert!(!keys.holds("logs/app/archive.0000000000000000000a-00000000000000000002.gz"));
        assert!(!keys.holds("logs/app/archive.gz"));
    }

    #[test]
    fn a_constant_file_prefix_starts_the_file_name() {
        let keys = sink_keys("/logs//%Y/%m", "app-", "", "s3");
        assert_eq!(keys.prefix, "logs/");
        assert_eq!(keys.head, Head::FileName("app-".into()));
        assert!(keys.holds(&format!("logs/2024/05/app-s3.{RANGE}")));
        assert!(!keys.holds(&format!("logs/2024/05/web-s3.{RANGE}")));
        assert!(!keys.holds(&format!("logs/2024/05/app-logs3.{RANGE}")));
        assert!(!keys.holds(&format!("other/2024/05/app-s3.{RANGE}")));

        // A path that is all constant, with a file prefix holding directories.
        let keys = sink_keys("out", "day/x-", ".log", "s3");
        assert_eq!(keys.prefix, "out/day/");
        assert_eq!(keys.head, Head::Exact("x-".into()));
        assert!(keys.holds(&format!("out/day/x-s3.{RANGE}.log")));
        assert!(!keys.holds(&format!("out/day/y-s3.{RANGE}.log")));
    }

    #[test]
    fn escapes_in_the_file_prefix_accept_any_start() {
        let keys = sink_keys("logs/%Y", "%{host}-", ".jsonl", "archive");
        assert_eq!(keys.prefix, "logs/");
        assert!(keys.holds(&format!("logs/2024/web1-archive.{RANGE}.jsonl")));
        assert!(keys.holds(&format!("logs/2024/a/b-archive.{RANGE}.jsonl")));
        assert!(!keys.holds(&format!("logs/2024/web1-other.{RANGE}.jsonl")));

        // The listing prefix stops at the last `/` before the first escape.
        let keys = sink_keys("logs/day-%Y", "", "", "a");
        assert_eq!(keys.prefix, "logs/");
        let keys = sink_keys("%{tenant}/logs", "", "", "a");
        assert_eq!(keys.prefix, "");
        let keys = sink_keys("", "", "", "a");
        assert_eq!(keys.prefix, "");
        assert!(keys.holds(&format!("a.{RANGE}")));
        assert!(!keys.holds(&format!("x/a.{RANGE}")));
    }

    #[test]
    fn names_are_compared_as_the_store_holds_them() {
        // `{` is percent-encoded in keys.
        let keys = sink_keys("logs", "", ".gz", "sink{1}");
        let key = ObjectPath::from(format!("logs/sink{{1}}.{RANGE}.gz").as_str()).to_string();
        assert!(key.contains('%'));
        assert!(keys.holds(&key));
    }

    /// How the mock store pages its listing.
    #[derive(Clone, Copy)]
    enum Paging {
        /// As AWS: both next markers.
        Aws,
        /// As SeaweedFS 4: the next upload id marker only, pages by upload id.
        UploadIdOnly,
        /// A truncated page without markers.
        Broken,
        /// 403 AccessDenied.
        Refused,
    }

    #[derive(Default)]
    struct Mock {
        queries: std::sync::Mutex<Vec<Vec<(String, String)>>>,
    }

    /// A store answering `GET /logs/?uploads` with uploads `a/1`, `b/2`, `c/3`, two a page.
    async fn mock(paging: Paging) -> (AmazonS3, std::sync::Arc<Mock>) {
        use axum::extract::{RawQuery, State};
        use axum::http::StatusCode;
        use std::sync::Arc;

        let state = Arc::new(Mock::default());
        let list = move |State(state): State<Arc<Mock>>, RawQuery(query): RawQuery| async move {
            let url = object_store::signer::Url::parse(&format!(
                "http://x/?{}",
                query.unwrap_or_default()
            ))
            .unwrap();
            let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
            state.queries.lock().unwrap().push(pairs.clone());
            let get = |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            };
            let upload = |key: &str, id: &str| {
                format!("<Upload><Key>{key}</Key><UploadId>{id}</UploadId></Upload>")
            };
            let second = match paging {
                Paging::Refused => {
                    return (
                        StatusCode::FORBIDDEN,
                        "<Error><Code>AccessDenied</Code><Message>no</Message></Error>".to_owned(),
                    );
                }
                Paging::Aws => {
                    get("key-marker").as_deref() == Some("b")
                        && get("upload-id-marker").as_deref() == Some("2")
                }
                Paging::UploadIdOnly => {
                    get("key-marker").is_none() && get("upload-id-marker").as_deref() == Some("2")
                }
                Paging::Broken => false,
            };
            let body = if second {
                format!(
                    "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>{}</ListMultipartUploadsResult>",
                    upload("c", "3")
                )
            } else {
                let markers = match paging {
                    Paging::Aws => {
                        "<NextKeyMarker>b</NextKeyMarker><NextUploadIdMarker>2</NextUploadIdMarker>"
                    }
                    Paging::UploadIdOnly => "<NextUploadIdMarker>2</NextUploadIdMarker>",
                    _ => "",
                };
                format!(
                    "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated>{markers}{}{}</ListMultipartUploadsResult>",
                    upload("a", "1"),
                    upload("b", "2")
                )
            };
            (StatusCode::OK, body)
        };
        let app = axum::Router::new()
            .route("/logs/", axum::routing::get(list))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        ferry_core::install_tls_provider();
        let store = object_store::aws::AmazonS3Builder::new()
            .with_bucket_name("logs")
            .with_endpoint(format!("http://{address}"))
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .with_region("us-east-1")
            .with_access_key_id("key")
            .with_secret_access_key("secret")
            .build()
            .unwrap();
        (store, state)
    }

    fn ids(uploads: &[Upload]) -> Vec<(&str, &str)> {
        uploads
            .iter()
            .map(|u| (u.key.as_str(), u.upload_id.as_str()))
            .collect()
    }

    #[tokio::test]
    async fn listing_follows_the_pages_signed() {
        for paging in [Paging::Aws, Paging::UploadIdOnly] {
            let (store, state) = mock(paging).await;
            let uploads = list(&store, "app/", Duration::from_secs(5)).await.unwrap();
            assert_eq!(ids(&uploads), [("a", "1"), ("b", "2"), ("c", "3")]);
            let queries = state.queries.lock().unwrap();
            assert_eq!(queries.len(), 2);
            for query in queries.iter() {
                let names: Vec<&str> = query.iter().map(|(k, _)| k.as_str()).collect();
                assert!(names.contains(&"uploads"), "{names:?}");
                assert!(names.contains(&"X-Amz-Signature"), "{names:?}");
                assert!(
                    query.contains(&("prefix".into(), "app/".into())),
                    "{query:?}"
                );
                assert!(
                    query
                        .iter()
                        .any(|(k, v)| k == "X-Amz-Credential" && v.starts_with("key/")),
                    "{query:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_refused_or_endless_listing_is_an_error() {
        let (store, _) = mock(Paging::Refused).await;
        let error = list(&store, "", Duration::from_secs(5)).await.unwrap_err();
        assert!(
            error.contains("403") && error.contains("AccessDenied"),
            "{error}"
        );
        let (store, _) = mock(Paging::Broken).await;
        let error = list(&store, "", Duration::from_secs(5)).await.unwrap_err();
        assert!(error.contains("without a next marker"), "{error}");
    }

    #[test]
    fn listing_pages_parse() {
        let page: ListMultipartUploadsResult = quick_xml::de::from_str(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<ListMultipartUploadsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Bucket>logs</Bucket>
  <KeyMarker></KeyMarker>
  <UploadIdMarker></UploadIdMarker>
  <NextKeyMarker>app/b&amp;c</NextKeyMarker>
  <NextUploadIdMarker>id-2</NextUploadIdMarker>
  <Prefix>app/</Prefix>
  <MaxUploads>2</MaxUploads>
  <IsTruncated>true</IsTruncated>
  <Upload>
    <Key>app/a</Key>
    <UploadId>id-1</UploadId>
    <Initiator><ID>x</ID><DisplayName>x</DisplayName></Initiator>
    <StorageClass>STANDARD</StorageClass>
    <Initiated>2024-05-01T00:00:00.000Z</Initiated>
  </Upload>
  <Upload>
    <Key>app/b&amp;c</Key>
    <UploadId>id-2</UploadId>
  </Upload>
</ListMultipartUploadsResult>"#,
        )
        .unwrap();
        assert!(page.is_truncated);
        assert_eq!(page.next_key_marker.as_deref(), Some("app/b&c"));
        assert_eq!(page.next_upload_id_marker.as_deref(), Some("id-2"));
        let uploads: Vec<(&str, &str)> = page
            .uploads
            .iter()
            .map(|u| (u.key.as_str(), u.upload_id.as_str()))
            .collect();
        assert_eq!(uploads, [("app/a", "id-1"), ("app/b&c", "id-2")]);

        let empty: ListMultipartUploadsResult = quick_xml::de::from_str(
            "<ListMultipartUploadsResult><Bucket>logs</Bucket><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>",
        )
        .unwrap();
        assert!(!empty.is_truncated && empty.uploads.is_empty());

        let error: ErrorAnswer = quick_xml::de::from_str(
            "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>",
        )
        .unwrap();
        assert_eq!(error.code, "AccessDenied");
    }
}
